//! `/api/v1/topics`: produce records to a topic and read them back.

use std::collections::BTreeMap;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};

use super::{ApiError, AppState, JSON_LIMIT, blocking};
use crate::http::model::{ProduceRecord, Produced};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/topics", get(list))
        .route("/api/v1/topics/{topic}/records", post(produce).get(read))
        .layer(axum::extract::DefaultBodyLimit::max(JSON_LIMIT))
}

#[derive(Serialize, schemars::JsonSchema)]
pub(crate) struct TopicInfo {
    name: String,
    partitions: u32,
}

async fn list(State(baton): State<AppState>) -> Result<Json<Vec<TopicInfo>>, ApiError> {
    let topics = blocking(move || Ok(baton.transport().topics()?)).await?;
    Ok(Json(
        topics
            .into_iter()
            .map(|(name, partitions)| TopicInfo { name, partitions })
            .collect(),
    ))
}

/// One record of a produce request: UTF-8 strings; `value: null` is a tombstone.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewRecord {
    key: Option<String>,
    value: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    timestamp: Option<i64>,
}

/// Most records in one produce request.
const MAX_RECORDS: usize = 100_000;

async fn produce(
    State(baton): State<AppState>,
    topic: Result<Path<String>, PathRejection>,
    body: Result<Json<Vec<NewRecord>>, JsonRejection>,
) -> Result<Json<Vec<Produced>>, ApiError> {
    let Path(topic) = topic?;
    let Json(records) = body.map_err(|e| {
        ApiError::from(e)
            .with_hint(r#"send a JSON array of {"key": string|null, "value": string|null, "headers"?: {name: string}}"#)
    })?;
    if records.len() > MAX_RECORDS {
        return Err(ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} records in one request; send at most {MAX_RECORDS}",
                records.len()
            ),
        ));
    }
    let records = records
        .into_iter()
        .map(|r| ProduceRecord {
            key: r.key.map(String::into_bytes),
            value: r.value.map(String::into_bytes),
            headers: r
                .headers
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect(),
            timestamp: r.timestamp,
        })
        .collect();
    Ok(Json(
        blocking(move || baton.produce(&topic, records)).await?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    slot: u32,
    #[serde(default)]
    offset: u64,
    limit: Option<usize>,
}

#[derive(Serialize, schemars::JsonSchema)]
pub(crate) struct HeaderOut {
    key: String,
    value: Option<String>,
    value_base64: String,
}

#[derive(Serialize, schemars::JsonSchema)]
pub(crate) struct RecordOut {
    offset: u64,
    timestamp: i64,
    key: Option<String>,
    key_base64: Option<String>,
    value: Option<String>,
    value_base64: Option<String>,
    headers: Vec<HeaderOut>,
}

#[derive(Serialize, schemars::JsonSchema)]
pub(crate) struct ReadOut {
    topic: String,
    slot: u32,
    records: Vec<RecordOut>,
    next_offset: u64,
    end_offset: u64,
}

async fn read(
    State(baton): State<AppState>,
    topic: Result<Path<String>, PathRejection>,
    q: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Json<ReadOut>, ApiError> {
    let Path(topic) = topic?;
    let Query(q) = q.map_err(|e| {
        ApiError::bad_request(format!("{}; use ?slot=N&offset=N&limit=N", e.body_text()))
    })?;
    let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
    let t = topic.clone();
    let (records, end) = blocking(move || baton.read_records(&t, q.slot, q.offset, limit)).await?;
    let next_offset = records
        .last()
        .map(|r| r.offset + 1)
        .unwrap_or(q.offset.min(end));
    let text = |b: &Option<Vec<u8>>| b.as_ref().and_then(|b| String::from_utf8(b.clone()).ok());
    let b64 = |b: &Option<Vec<u8>>| b.as_ref().map(|b| B64.encode(b));
    let records = records
        .into_iter()
        .map(|r| RecordOut {
            offset: r.offset,
            timestamp: r.record.timestamp,
            key: text(&r.record.key),
            key_base64: b64(&r.record.key),
            value: text(&r.record.value),
            value_base64: b64(&r.record.value),
            headers: r
                .record
                .headers
                .iter()
                .map(|(k, v)| HeaderOut {
                    key: k.clone(),
                    value: String::from_utf8(v.clone()).ok(),
                    value_base64: B64.encode(v),
                })
                .collect(),
        })
        .collect();
    Ok(Json(ReadOut {
        topic,
        slot: q.slot,
        records,
        next_offset,
        end_offset: end,
    }))
}
