//! `/api/v1/modules`: upload and list processor components.

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;

use super::{ApiError, AppState, MODULE_LIMIT, blocking};
use crate::control::{ModuleDeletion, ModuleRecord};

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/modules", post(upload).get(list))
        .route("/api/v1/modules/{name}/{version}", delete(remove))
        .layer(DefaultBodyLimit::max(MODULE_LIMIT))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UploadQuery {
    name: String,
    version: String,
}

async fn upload(
    State(baton): State<AppState>,
    q: Result<Query<UploadQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<ModuleRecord>), ApiError> {
    let Query(q) = q.map_err(|e| {
        ApiError::bad_request(format!("{}; use ?name=NAME&version=VERSION", e.body_text()))
    })?;
    let body = body?;
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "empty body: send the component's bytes (application/wasm)",
        ));
    }
    let record = blocking(move || baton.upload_module(&q.name, &q.version, &body)).await?;
    Ok((StatusCode::CREATED, Json(record)))
}

async fn list(State(baton): State<AppState>) -> Json<Vec<ModuleRecord>> {
    Json(baton.modules())
}

async fn remove(
    State(baton): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<ModuleDeletion>, ApiError> {
    let Path((name, version)) = path?;
    Ok(Json(
        blocking(move || baton.delete_module(&name, &version)).await?,
    ))
}
