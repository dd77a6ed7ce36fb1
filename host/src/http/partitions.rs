//! `/api/v1/partitions`: the partition table, and live moves.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};

use super::{AppState, blocking};
use crate::cluster::moves::{DrainRequest, Drained, MoveAccepted, MoveRequest};
use crate::http::ApiError;
use crate::http::model::PartitionInfo;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/partitions", get(list))
        .route("/api/v1/partitions/{id}/move", post(move_partition))
        .route("/api/v1/partitions/{id}/drain", post(drain))
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
