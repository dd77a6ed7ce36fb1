//! The HTTP API (axum) under `/api/v1`, `/healthz` and the dashboard at `/`. One router per
//! resource; every handler answers JSON, and bad input gets a 4xx naming the problem.

pub mod error;
mod forward;
mod host;
mod metrics;
pub mod model;
mod modules;
pub mod openapi;
mod partitions;
mod pipelines;
pub mod stream;
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
/// Largest body of every other call (axum's default).
pub const DEFAULT_LIMIT: usize = 2 << 20;

/// The largest body a call to `path` accepts: what the routers of `modules.rs` and `topics.rs`
/// set with `DefaultBodyLimit`, and axum's default elsewhere.
fn body_limit(path: &str) -> usize {
    if path.starts_with("/api/v1/modules") {
        MODULE_LIMIT
    } else if path.starts_with("/api/v1/topics") {
        JSON_LIMIT
    } else {
        DEFAULT_LIMIT
    }
}

/// The whole API.
pub fn router(baton: Arc<Baton>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/assets/{file}", get(asset))
        .route("/api/v1/stream", get(stream::stream))
        .route(
            "/api/v1/auth/check",
            axum::routing::post(stream::auth_check),
        )
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::render))
        .route("/api/v1/openapi.json", get(openapi::serve))
        .merge(host::router())
        .merge(modules::router())
        .merge(pipelines::router())
        .merge(partitions::router())
        .merge(topics::router())
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            baton.clone(),
            forward::to_controller,
        ))
        .layer(axum::middleware::from_fn_with_state(baton.clone(), auth))
        .layer(axum::middleware::from_fn(drain_unread))
        .layer(axum::middleware::from_fn_with_state(
            baton.clone(),
            stream::cors,
        ))
        .layer(axum::Extension(Arc::new(stream::Feed::new(
            baton.host_id(),
        ))))
        .with_state(baton)
}

/// Most of a request body that an answer given without reading it (413, 401, 400) is read
/// and thrown away, and how long that may take.
const DRAIN_MAX: usize = 2 * MODULE_LIMIT;
const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// A request body that its handler may drop unread while the middleware keeps it.
struct Kept(Arc<parking_lot::Mutex<axum::body::Body>>);

impl http_body::Body for Kept {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut *self.0.lock()).poll_frame(cx)
    }
}

/// Reads what is left of a request's body before the answer goes out, up to [`DRAIN_MAX`]
/// bytes and [`DRAIN_FOR`]. A server that answers (say 413 for an upload over the limit)
/// and closes while the client is still sending resets the connection, and the client sees
/// the reset instead of the answer; read to the end, the connection stays usable too.
async fn drain_unread(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    let limit = body_limit(parts.uri.path());
    let sent: Option<u64> = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let kept = Arc::new(parking_lot::Mutex::new(body));
    let resp = next
        .run(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::new(Kept(kept.clone())),
        ))
        .await;
    let mut rest = std::mem::take(&mut *kept.lock());
    let drain = async {
        let mut read = 0usize;
        while read <= DRAIN_MAX {
            let frame = std::future::poll_fn(|cx| {
                http_body::Body::poll_frame(std::pin::Pin::new(&mut rest), cx)
            })
            .await;
            match frame {
                Some(Ok(f)) => read += f.data_ref().map_or(0, |d| d.len()),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_FOR, drain).await;
    if resp.extensions().get::<error::BodyOverLimit>().is_some() {
        let sent = sent.map(|n| format!("of {n} bytes ")).unwrap_or_default();
        return ApiError::new(
            resp.status(),
            format!(
                "the request body {sent}is over this call's limit of {} MiB",
                limit >> 20
            ),
        )
        .into_response();
    }
    resp
}

/// With a token configured, every call that changes something (any method but GET and HEAD)
/// needs `Authorization: Bearer <token>`.
async fn auth(
    axum::extract::State(baton): axum::extract::State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{Method, header};
    let Some(token) = &baton.config().token else {
        return next.run(req).await;
    };
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), token.as_bytes()) => next.run(req).await,
        Some(_) => unauthorized("the bearer token is wrong"),
        None => unauthorized(&format!(
            "{} {} changes state and needs `Authorization: Bearer <token>` (this host runs with --token)",
            req.method(),
            req.uri().path()
        )),
    }
}

fn unauthorized(message: &str) -> axum::response::Response {
    let mut r = ApiError::new(axum::http::StatusCode::UNAUTHORIZED, message).into_response();
    r.headers_mut().insert(
        axum::http::header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    r
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Ready when every partition is running (not starting, restoring, recovering or failed).
async fn readyz(
    axum::extract::State(baton): axum::extract::State<AppState>,
) -> axum::response::Response {
    let parts = baton.partitions();
    let waiting: Vec<_> = parts
        .iter()
        .filter(|p| p.state != model::PartitionState::Running)
        .map(|p| serde_json::json!({ "id": p.id, "state": p.state, "error": p.error }))
        .collect();
    if waiting.is_empty() {
        axum::Json(serde_json::json!({ "status": "ready", "partitions": parts.len() }))
            .into_response()
    } else {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({ "status": "not ready", "waiting": waiting })),
        )
            .into_response()
    }
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

/// With this variable set to a directory, the dashboard's files are read from it at each
/// request instead of from the binary: for working on the page without rebuilding.
pub const DASHBOARD_DIR_ENV: &str = "BATON_DASHBOARD_DIR";

/// A dashboard file: from [`DASHBOARD_DIR_ENV`] when it is set, else the one built in.
fn dashboard_file(name: &str, built_in: &'static str) -> std::borrow::Cow<'static, str> {
    match std::env::var_os(DASHBOARD_DIR_ENV) {
        Some(dir) => std::fs::read_to_string(std::path::Path::new(&dir).join(name)).map_or(
            std::borrow::Cow::Borrowed(built_in),
            std::borrow::Cow::Owned,
        ),
        None => std::borrow::Cow::Borrowed(built_in),
    }
}

async fn dashboard() -> impl IntoResponse {
    (
        [(axum::http::header::CACHE_CONTROL, "no-cache")],
        Html(dashboard_file(
            "index.html",
            include_str!("dashboard/index.html"),
        )),
    )
}

/// The dashboard's files, built into the binary: no CDN, nothing fetched from elsewhere.
async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> axum::response::Response {
    let (body, kind) = match file.as_str() {
        "app.js" => (
            dashboard_file("app.js", include_str!("dashboard/app.js")),
            "text/javascript; charset=utf-8",
        ),
        "app.css" => (
            dashboard_file("app.css", include_str!("dashboard/app.css")),
            "text/css; charset=utf-8",
        ),
        _ => {
            return ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                format!("no dashboard file `{file}`"),
            )
            .into_response();
        }
    };
    (
        [
            (axum::http::header::CONTENT_TYPE, kind),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Runs blocking work (RocksDB, fsync, compilation) off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::error::Error> + Send + 'static,
) -> Result<T, ApiError> {
    Ok(tokio::task::spawn_blocking(f).await??)
}
