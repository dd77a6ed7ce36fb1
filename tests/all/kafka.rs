//! The broker started by `scripts/kafka` is reachable with rdkafka's admin client.

use baton::transport::TransportError;
use baton::transport::kafka::{KafkaAdmin, KafkaError};

fn bootstrap() -> String {
    std::env::var("BATON_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_client_creates_and_lists_a_topic() -> anyhow::Result<()> {
    let admin = KafkaAdmin::new(&bootstrap(), &[])?;
    let name = format!(
        "baton-test-{}-{}",
        std::process::id(),
        baton::cluster::now_ms()
    );
    assert!(
        admin
            .ensure_topic(&name, 3, &[("cleanup.policy", "compact")])
            .await?,
        "created"
    );
    assert!(!admin.ensure_topic(&name, 3, &[]).await?, "already there");
    let listed = admin.topics()?;
    let t = listed
        .iter()
        .find(|t| t.name == name)
        .expect("the new topic is listed");
    assert_eq!(t.partitions, 3);
    match admin.ensure_topic(&name, 5, &[]).await {
        Err(KafkaError::Topic(TransportError::PartitionCountMismatch {
            actual: 3,
            wanted: 5,
            ..
        })) => {}
        other => panic!("expected a partition count mismatch, got {other:?}"),
    }
    admin.delete_topics(&[&name]).await?;
    Ok(())
}
