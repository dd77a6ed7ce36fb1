//! `/api/v1/partitions`: the partition table, and live moves.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};

use super::{AppState, blocking};
use crate::cluster::moves::{DrainRequest, Drained, MoveAccepted, MoveRequest};
use crate::http::ApiError;
use crate::http::model::{CheckpointInfo, Manifest, PartitionInfo};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/partitions", get(list))
        .route("/api/v1/partitions/{id}/move", post(move_partition))
        .route("/api/v1/partitions/{id}/drain", post(drain))
        .route("/api/v1/partitions/{id}/checkpoint", post(checkpoint))
        .route("/api/v1/partitions/{id}/checkpoints", get(checkpoints))
}

/// How long a checkpoint asked of another host may take there.
const REMOTE_CHECKPOINT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Takes a checkpoint of the partition now, on its owner (another host's partition is asked of
/// it, with the caller's token): what is pending commits first.
async fn checkpoint(
    State(baton): State<AppState>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
) -> Result<Json<CheckpointInfo>, ApiError> {
    let forwarded = headers.contains_key(super::forward::FORWARDED_BY);
    if !forwarded && let Some((owner, url)) = baton.remote_owner(&id) {
        let unavailable = |why: String| {
            ApiError::from(crate::error::Error::Unavailable(format!(
                "host {owner} ({url}) owns `{id}` and could not take its checkpoint: {why}"
            )))
        };
        static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
        let mut req = CLIENT
            .get_or_init(reqwest::Client::new)
            .post(format!("{url}/api/v1/partitions/{id}/checkpoint"))
            .header(super::forward::FORWARDED_BY, baton.host_id())
            .timeout(REMOTE_CHECKPOINT_TIMEOUT);
        if let Some(auth) = headers.get(axum::http::header::AUTHORIZATION) {
            req = req.header(axum::http::header::AUTHORIZATION, auth.clone());
        }
        let resp = req.send().await.map_err(|e| unavailable(e.to_string()))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| unavailable(e.to_string()))?;
        if status.is_success() {
            return serde_json::from_slice(&body)
                .map(Json)
                .map_err(|e| unavailable(e.to_string()));
        }
        let text = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        return Err(ApiError::new(
            StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY),
            text,
        ));
    }
    Ok(Json(
        blocking(move || baton.checkpoint_partition(&id)).await?,
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

async fn list(State(baton): State<AppState>) -> Json<Vec<PartitionInfo>> {
    Json(baton.partitions())
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
