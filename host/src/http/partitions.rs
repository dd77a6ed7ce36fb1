//! `/api/v1/partitions`: the partition table, and live moves.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};

use super::{AppState, blocking};
use crate::cluster::merge::MergeRequest;
use crate::cluster::moves::{DrainRequest, Drained, MoveAccepted, MoveRequest};
use crate::cluster::split::SplitRequest;
use crate::control::{MergeRecord, SplitRecord};
use crate::http::ApiError;
use crate::http::model::{CheckpointInfo, Manifest, RewindReport};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/partitions", get(list))
        .route("/api/v1/partitions/{id}/move", post(move_partition))
        .route("/api/v1/partitions/{id}/drain", post(drain))
        .route("/api/v1/partitions/{id}/checkpoint", post(checkpoint))
        .route("/api/v1/partitions/{id}/checkpoints", get(checkpoints))
        .route("/api/v1/partitions/{id}/rewind", post(rewind))
        .route("/api/v1/partitions/{id}/split", post(split))
        .route("/api/v1/partitions/merge", post(merge))
        .route("/api/v1/balancer/log", get(balancer_log))
}

/// The query of `GET /api/v1/partitions`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// With `true`: the partitions retired by splits, with their history, instead.
    #[serde(default)]
    retired: bool,
}

/// The balancer's decisions, oldest first (the controller answers: other hosts forward).
async fn balancer_log(
    State(baton): State<AppState>,
) -> Json<Vec<crate::cluster::balancer::Decision>> {
    Json(baton.balancer_log())
}

/// Merges two adjacent partitions, on the owner of `left` (which moves `right` to itself
/// first when it runs elsewhere); answers the merge once the merged partition runs.
async fn merge(
    State(baton): State<AppState>,
    headers: axum::http::HeaderMap,
    body: Result<Json<MergeRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<MergeRecord>, ApiError> {
    let Json(req) = body?;
    let forward = serde_json::to_value(&req).unwrap_or_default();
    let path = "/api/v1/partitions/merge";
    if let Some(answer) = on_owner(&baton, &req.left, path, Some(forward), &headers).await {
        return answer.map(Json);
    }
    Ok(Json(
        blocking(move || baton.merge_partitions(&req.left, &req.right, req.reason.as_deref()))
            .await?,
    ))
}

/// Splits the partition in two, on its owner (another host's partition is asked of it, with
/// the caller's token); answers the split once its halves run.
async fn split(
    State(baton): State<AppState>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    body: bytes::Bytes,
) -> Result<Json<SplitRecord>, ApiError> {
    let req: SplitRequest = if body.iter().all(u8::is_ascii_whitespace) {
        SplitRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::from(crate::error::Error::BadRequest(format!(
                "the body must be {{\"at\": SLOT}} or empty: {e}"
            )))
        })?
    };
    let path = format!("/api/v1/partitions/{id}/split");
    let forward = serde_json::to_value(&req).unwrap_or_default();
    if let Some(answer) = on_owner(&baton, &id, &path, Some(forward), &headers).await {
        return answer.map(Json);
    }
    Ok(Json(
        blocking(move || baton.split_partition(&id, req.at, req.reason.as_deref())).await?,
    ))
}

/// The largest answer read from a partition's owner.
const ANSWER_LIMIT: usize = 16 << 20;

/// The body of `POST /api/v1/partitions/{id}/rewind`.
#[derive(Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindRequest {
    /// The retained checkpoint to go back to (its `seq`).
    pub seq: u64,
}

/// Where partition `id` runs on another host: that host's answer to `POST {path}` with `body`
/// (and the caller's token); `None` when it runs here (or the call was forwarded here).
pub(super) async fn on_owner<T: serde::de::DeserializeOwned>(
    baton: &AppState,
    id: &str,
    path: &str,
    body: Option<serde_json::Value>,
    headers: &axum::http::HeaderMap,
) -> Option<Result<T, ApiError>> {
    if headers.contains_key(super::forward::FORWARDED_BY) {
        return None;
    }
    let (owner, url) = baton.remote_owner(id)?;
    let unavailable = |why: String| {
        ApiError::from(crate::error::Error::Unavailable(format!(
            "host {owner} ({url}) owns `{id}` and could not answer: {why}"
        )))
    };
    if url.is_empty() {
        return Some(Err(unavailable(
            "its address is not known here yet; try again".into(),
        )));
    }
    let body = body.map_or_else(bytes::Bytes::new, |b| b.to_string().into());
    let mut headers = headers.clone();
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    let answer = async {
        let resp =
            super::forward::send(baton, &url, axum::http::Method::POST, path, &headers, body)
                .await
                .map_err(|e| unavailable(e.to_string()))?;
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), ANSWER_LIMIT)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|e| unavailable(e.to_string()));
        }
        let text = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        Err(ApiError::new(status, text))
    };
    Some(answer.await)
}

/// Takes a checkpoint of the partition now, on its owner (another host's partition is asked of
/// it, with the caller's token): what is pending commits first.
async fn checkpoint(
    State(baton): State<AppState>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
) -> Result<Json<CheckpointInfo>, ApiError> {
    let path = format!("/api/v1/partitions/{id}/checkpoint");
    if let Some(answer) = on_owner(&baton, &id, &path, None, &headers).await {
        return answer.map(Json);
    }
    Ok(Json(
        blocking(move || baton.checkpoint_partition(&id)).await?,
    ))
}

/// Puts the partition back to one of its retained checkpoints, on its owner: state and input
/// offsets, at a batch boundary; it then processes again from there.
async fn rewind(
    State(baton): State<AppState>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    body: Result<Json<RewindRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<RewindReport>, ApiError> {
    let Json(req) = body?;
    let path = format!("/api/v1/partitions/{id}/rewind");
    let forward = serde_json::json!({ "seq": req.seq });
    if let Some(answer) = on_owner(&baton, &id, &path, Some(forward), &headers).await {
        return answer.map(Json);
    }
    Ok(Json(
        blocking(move || baton.rewind_partition(&id, req.seq)).await?,
    ))
}

/// The partition's retained checkpoints in the checkpoint store, oldest first.
async fn checkpoints(
    State(baton): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Vec<Manifest>>, ApiError> {
    Ok(Json(
        blocking(move || baton.partition_checkpoints(&id)).await?,
    ))
}

async fn list(
    State(baton): State<AppState>,
    query: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let axum::extract::Query(q) = query.map_err(|e| {
        ApiError::from(crate::error::Error::BadRequest(format!(
            "the query may hold `retired=true` only: {e}"
        )))
    })?;
    let rows = if q.retired {
        serde_json::to_value(baton.retired_partitions())
    } else {
        serde_json::to_value(baton.partitions())
    };
    rows.map(Json)
        .map_err(|e| ApiError::from(crate::error::Error::Internal(e.to_string())))
}

/// Begins a live move; answers 202 with the move's id.
async fn move_partition(
    State(baton): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<MoveRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<MoveAccepted>), ApiError> {
    let Json(req) = body?;
    let move_id = blocking(move || baton.request_move(&id, &req.to)).await?;
    Ok((StatusCode::ACCEPTED, Json(MoveAccepted { move_id })))
}

/// The owner's side of a move's handoff (called by the move's target).
async fn drain(
    State(baton): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<DrainRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Drained>, ApiError> {
    let Json(req) = body?;
    Ok(Json(
        blocking(move || baton.drain_for_move(&id, &req.move_id)).await?,
    ))
}
