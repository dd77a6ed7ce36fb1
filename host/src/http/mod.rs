//! The HTTP API (axum) under `/api/v1`, `/healthz` and the dashboard at `/`. One router per
//! resource; every handler answers JSON, and bad input gets a 4xx naming the problem.

pub mod error;
mod host;
mod modules;
mod partitions;
mod pipelines;
mod topics;

use std::sync::Arc;

use axum::Router;
use axum::response::{Html, IntoResponse};
use axum::routing::get;

pub use error::ApiError;

use crate::app::Baton;

/// Shared state of the handlers.
pub type AppState = Arc<Baton>;

/// Largest JSON body accepted (records, specs).
pub const JSON_LIMIT: usize = 16 << 20;
/// Largest module upload accepted.
pub const MODULE_LIMIT: usize = 64 << 20;

/// The whole API.
pub fn router(baton: Arc<Baton>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/healthz", get(healthz))
        .merge(host::router())
        .merge(modules::router())
        .merge(pipelines::router())
        .merge(partitions::router())
        .merge(topics::router())
        .fallback(not_found)
        .with_state(baton)
}

async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({ "status": "ok" }))
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        format!("no route for {uri}; the API lives under /api/v1"),
    )
}

async fn dashboard() -> Html<&'static str> {
    Html(include_str!("dashboard.html"))
}

/// Runs blocking work (RocksDB, fsync, compilation) off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::error::Error> + Send + 'static,
) -> Result<T, ApiError> {
    Ok(tokio::task::spawn_blocking(f).await??)
}
