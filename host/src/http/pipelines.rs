//! `/api/v1/pipelines`: create and list pipelines, and look up state by key.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};

use super::{ApiError, AppState, blocking};
use crate::control::{DeadLetterReplay, PipelineDeletion, PipelineSpec};
use crate::error::Error;
use crate::http::model::{PipelineInfo, PipelinePatch, ScanPage, SwapResult, SwapStatus};
use crate::partition::Event;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/pipelines", post(create).get(list))
        .route(
            "/api/v1/pipelines/{pipeline}",
            get(show).delete(delete).patch(update),
        )
        .route("/api/v1/pipelines/{pipeline}/module", put(swap))
        .route("/api/v1/pipelines/{pipeline}/events", get(events))
        .route("/api/v1/pipelines/{pipeline}/rewind", post(rewind))
        .route(
            "/api/v1/pipelines/{pipeline}/dead-letters/replay",
            post(replay),
        )
        .route(
            "/api/v1/pipelines/{pipeline}/stores/{store}/keys",
            get(scan),
        )
        .route(
            "/api/v1/pipelines/{pipeline}/stores/{store}/keys/{key}",
            get(lookup),
        )
}

async fn create(
    State(baton): State<AppState>,
    spec: Result<Json<PipelineSpec>, JsonRejection>,
) -> Result<(StatusCode, Json<PipelineInfo>), ApiError> {
    let Json(spec) = spec?;
    let info = blocking(move || baton.create_pipeline(spec)).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

async fn update(
    State(baton): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<PipelinePatch>, JsonRejection>,
) -> Result<(StatusCode, Json<PipelineInfo>), ApiError> {
    let Path(name) = path?;
    let Json(patch) = body.map_err(|e| {
        ApiError::from(e).with_hint("send a JSON object with any of limits, config, swap, wasi")
    })?;
    let (info, applied) = blocking(move || baton.update_pipeline(&name, patch, SWAP_WAIT)).await?;
    let status = if applied {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(info)))
}

/// The body of `POST /api/v1/pipelines/{p}/dead-letters/replay`.
#[derive(serde::Deserialize, schemars::JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayBody {
    /// Replay only this slot's dead letters (its partition of the dead-letter topic).
    slot: Option<u32>,
    /// First offset (with `slot`); default: where the slot's last replay ended.
    from: Option<u64>,
    /// End offset, exclusive (with `slot`); default: the end of the dead-letter topic now.
    to: Option<u64>,
}

/// The body of `POST /api/v1/pipelines/{p}/rewind`.
#[derive(Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineRewind {
    /// Per partition of the pipeline, every one of them: the retained checkpoint (its `seq`)
    /// to put it back to.
    pub checkpoints: std::collections::BTreeMap<String, u64>,
}

/// Puts every partition of the pipeline back to a retained checkpoint, each on its owner at a
/// batch boundary: state and input offsets together; each then processes again from there.
/// Outputs sent since stay sent.
async fn rewind(
    State(baton): State<AppState>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
    body: Result<Json<PipelineRewind>, JsonRejection>,
) -> Result<Json<Vec<crate::http::model::RewindReport>>, ApiError> {
    let Json(req) = body?;
    let partitions: Vec<String> = {
        let b = baton.clone();
        blocking(move || Ok::<_, Error>(b.partitions())).await?
    }
    .into_iter()
    .filter(|p| p.pipeline == name)
    .map(|p| p.id)
    .collect();
    if partitions.is_empty() {
        return Err(Error::NotFound(format!("pipeline `{name}` has no partitions")).into());
    }
    let missing: Vec<&String> = partitions
        .iter()
        .filter(|p| !req.checkpoints.contains_key(*p))
        .collect();
    let unknown: Vec<&String> = req
        .checkpoints
        .keys()
        .filter(|k| !partitions.contains(k))
        .collect();
    if !missing.is_empty() || !unknown.is_empty() {
        return Err(Error::BadRequest(format!(
            "name a checkpoint for every partition of `{name}` and no other: missing {missing:?}, \
             not of the pipeline {unknown:?}"
        ))
        .into());
    }
    let mut reports = Vec::new();
    for (id, seq) in req.checkpoints {
        let path = format!("/api/v1/partitions/{id}/rewind");
        let body = serde_json::json!({ "seq": seq });
        let report =
            match super::partitions::on_owner(&baton, &id, &path, Some(body), &headers).await {
                Some(answer) => answer?,
                None => {
                    let b = baton.clone();
                    blocking(move || b.rewind_partition(&id, seq)).await?
                }
            };
        reports.push(report);
    }
    Ok(Json(reports))
}

async fn replay(
    State(baton): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<ReplayBody>, JsonRejection>,
) -> Result<(StatusCode, Json<DeadLetterReplay>), ApiError> {
    let Path(name) = path?;
    let Json(b) = body.map_err(|e| {
        ApiError::from(e)
            .with_hint(r#"send {} for every dead letter, or {"slot": N, "from": A, "to": B}"#)
    })?;
    let r = blocking(move || baton.replay_dead_letters(&name, b.slot, b.from, b.to)).await?;
    Ok((StatusCode::ACCEPTED, Json(r)))
}

/// Query of `DELETE /api/v1/pipelines/{p}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    /// Also delete the pipeline's state and free its name.
    #[serde(default)]
    purge: bool,
}

async fn delete(
    State(baton): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<axum::extract::Query<DeleteQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<PipelineDeletion>, ApiError> {
    let Path(name) = path?;
    let axum::extract::Query(q) =
        query.map_err(|e| ApiError::from(e).with_hint("the only parameter is purge=true|false"))?;
    Ok(Json(
        blocking(move || baton.delete_pipeline(&name, q.purge)).await?,
    ))
}

async fn list(State(baton): State<AppState>) -> Json<Vec<PipelineInfo>> {
    Json(baton.pipelines())
}

async fn show(
    State(baton): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<PipelineInfo>, ApiError> {
    let name2 = name.clone();
    baton
        .pipelines()
        .into_iter()
        .find(|p| p.spec.name == name)
        .map(Json)
        .ok_or_else(|| Error::NotFound(format!("pipeline `{name2}` does not exist")).into())
}

/// Query of `GET .../keys/{key}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LookupQuery {
    /// Read only this slot.
    slot: Option<u32>,
}

async fn lookup(
    State(baton): State<AppState>,
    path: Result<Path<(String, String, String)>, PathRejection>,
    query: Result<axum::extract::Query<LookupQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    let Path((pipeline, store, key)) = path?;
    let axum::extract::Query(q) = query
        .map_err(|e| ApiError::from(e).with_hint("the only parameter is slot, a slot number"))?;
    let k = key.clone();
    let found = blocking(move || {
        baton
            .queries()
            .lookup(&pipeline, &store, k.as_bytes(), q.slot)
    })
    .await?;
    Ok(match found {
        Some(l) => Json(l).into_response(),
        None => {
            // The header tells a host that forwarded the query the key is missing, and not
            // the pipeline or the store.
            let mut r = ApiError::new(StatusCode::NOT_FOUND, format!("key `{key}` not found"))
                .into_response();
            r.headers_mut().insert(
                crate::query::MISSING_HEADER,
                axum::http::HeaderValue::from_static("key"),
            );
            r
        }
    })
}

/// The body of `PUT /api/v1/pipelines/{p}/module`.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SwapBody {
    /// The module version to run.
    version: String,
}

/// How long a swap call waits for every partition to reach a batch boundary.
const SWAP_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

async fn swap(
    State(baton): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<SwapBody>, JsonRejection>,
) -> Result<(StatusCode, Json<SwapResult>), ApiError> {
    let Path(pipeline) = path?;
    let Json(body) = body?;
    let result = blocking(move || baton.swaps().swap(&pipeline, &body.version, SWAP_WAIT)).await?;
    match result.outcome {
        SwapStatus::RolledBack => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "version `{}` was rolled back; `{}` runs: {}",
                result.version,
                result.running,
                result.reason.as_deref().unwrap_or("no reason recorded")
            ),
        )),
        SwapStatus::Pending => Ok((StatusCode::ACCEPTED, Json(result))),
        _ => Ok((StatusCode::OK, Json(result))),
    }
}

/// Query of `GET .../keys`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ScanQuery {
    /// Only keys starting with this (UTF-8).
    #[serde(default)]
    prefix: String,
    /// Page size, 1 to 1000 (default 100).
    limit: Option<usize>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    /// Only this slot.
    slot: Option<u32>,
}

async fn scan(
    State(baton): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<axum::extract::Query<ScanQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ScanPage>, ApiError> {
    let Path((pipeline, store)) = path?;
    let axum::extract::Query(q) = query.map_err(|e| {
        ApiError::bad_request(format!(
            "{}; use ?prefix=&limit=&cursor=&slot=",
            e.body_text()
        ))
    })?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit = {limit}: use 1 to 1000"
        )));
    }
    let page = blocking(move || {
        baton.queries().scan(
            &pipeline,
            &store,
            q.prefix.as_bytes(),
            limit,
            q.cursor.as_deref(),
            q.slot,
        )
    })
    .await?;
    Ok(Json(page))
}

/// Query of `GET .../events`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    /// Only events with a larger `seq`.
    #[serde(default)]
    after: u64,
    /// At most this many, 1 to 1000 (default 100).
    limit: Option<usize>,
}

async fn events(
    State(baton): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    query: Result<axum::extract::Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<Event>>, ApiError> {
    let Path(pipeline) = path?;
    let axum::extract::Query(q) = query
        .map_err(|e| ApiError::bad_request(format!("{}; use ?after=SEQ&limit=N", e.body_text())))?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    Ok(Json(baton.events(&pipeline, q.after, limit)?))
}
