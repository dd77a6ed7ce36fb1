//! `/api/v1/partitions`: the partition table.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};

use super::AppState;
use crate::http::model::PartitionInfo;

pub(super) fn router() -> Router<AppState> {
    Router::new().route("/api/v1/partitions", get(list))
}

async fn list(State(baton): State<AppState>) -> Json<Vec<PartitionInfo>> {
    Json(baton.partitions())
}
