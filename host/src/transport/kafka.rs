//! Apache Kafka through rdkafka: the production transport. This module holds what the rest of
//! the host needs from a broker, starting with topic administration.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::types::RDKafkaErrorCode;

use super::{TransportError, validate_topic_name};

/// Errors talking to Kafka.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// A client could not be created from the configuration.
    #[error("kafka client configuration: {0}")]
    Config(String),
    /// The broker answered with an error or did not answer in time.
    #[error("kafka: {0}")]
    Broker(String),
    /// A topic name or count was refused before asking the broker.
    #[error(transparent)]
    Topic(#[from] TransportError),
}

/// Topic administration on a Kafka cluster.
pub struct KafkaAdmin {
    admin: AdminClient<DefaultClientContext>,
    timeout: Duration,
}

/// The partition count and name of a topic as the broker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// Topic name.
    pub name: String,
    /// Number of partitions.
    pub partitions: u32,
}

impl KafkaAdmin {
    /// A client for `bootstrap` (e.g. `127.0.0.1:9092`) with extra librdkafka settings.
    pub fn new(bootstrap: &str, settings: &[(String, String)]) -> Result<Self, KafkaError> {
        let mut cfg = ClientConfig::new();
        cfg.set("bootstrap.servers", bootstrap);
        for (k, v) in settings {
            cfg.set(k, v);
        }
        let admin = cfg
            .create()
            .map_err(|e| KafkaError::Config(e.to_string()))?;
        Ok(KafkaAdmin {
            admin,
            timeout: Duration::from_secs(30),
        })
    }

    /// Creates `name` with `partitions` partitions and the given topic configs (e.g.
    /// `cleanup.policy=compact`). Returns `false` when it already exists with that count, and an
    /// error naming both counts when it exists with another.
    pub async fn ensure_topic(
        &self,
        name: &str,
        partitions: u32,
        configs: &[(&str, &str)],
    ) -> Result<bool, KafkaError> {
        validate_topic_name(name)?;
        let mut topic = NewTopic::new(name, partitions as i32, TopicReplication::Fixed(1));
        for (k, v) in configs {
            topic = topic.set(k, v);
        }
        let opts = AdminOptions::new()
            .operation_timeout(Some(self.timeout))
            .request_timeout(Some(self.timeout));
        let res = self
            .admin
            .create_topics([&topic], &opts)
            .await
            .map_err(|e| KafkaError::Broker(e.to_string()))?;
        match res.into_iter().next() {
            Some(Ok(_)) => Ok(true),
            Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => {
                let actual = self.topic(name)?.map(|t| t.partitions).unwrap_or(0);
                if actual == partitions {
                    Ok(false)
                } else {
                    Err(TransportError::PartitionCountMismatch {
                        topic: name.to_string(),
                        actual,
                        wanted: partitions,
                    }
                    .into())
                }
            }
            Some(Err((_, code))) => Err(KafkaError::Broker(format!(
                "creating topic `{name}`: {code}"
            ))),
            None => Err(KafkaError::Broker(format!(
                "creating topic `{name}`: no answer"
            ))),
        }
    }

    /// Every topic of the cluster with its partition count, sorted by name.
    pub fn topics(&self) -> Result<Vec<TopicInfo>, KafkaError> {
        let md = self
            .admin
            .inner()
            .fetch_metadata(None, self.timeout)
            .map_err(|e| KafkaError::Broker(e.to_string()))?;
        let mut v: Vec<_> = md
            .topics()
            .iter()
            .map(|t| TopicInfo {
                name: t.name().to_string(),
                partitions: t.partitions().len() as u32,
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }

    /// One topic, or `None` when the broker does not know it.
    pub fn topic(&self, name: &str) -> Result<Option<TopicInfo>, KafkaError> {
        let md = self
            .admin
            .inner()
            .fetch_metadata(Some(name), self.timeout)
            .map_err(|e| KafkaError::Broker(e.to_string()))?;
        Ok(md
            .topics()
            .iter()
            .find(|t| t.name() == name && t.error().is_none())
            .map(|t| TopicInfo {
                name: t.name().to_string(),
                partitions: t.partitions().len() as u32,
            }))
    }

    /// Deletes topics; missing ones are ignored.
    pub async fn delete_topics(&self, names: &[&str]) -> Result<(), KafkaError> {
        let opts = AdminOptions::new().operation_timeout(Some(self.timeout));
        let res = self
            .admin
            .delete_topics(names, &opts)
            .await
            .map_err(|e| KafkaError::Broker(e.to_string()))?;
        for r in res {
            if let Err((name, code)) = r
                && code != RDKafkaErrorCode::UnknownTopicOrPartition
            {
                return Err(KafkaError::Broker(format!(
                    "deleting topic `{name}`: {code}"
                )));
            }
        }
        Ok(())
    }
}
