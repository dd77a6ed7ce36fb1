//! Calls that change the catalog run on the controller: a host that takes one forwards it, with
//! the caller's headers (its token too), and answers with the controller's answer. Check and
//! change then happen on one host, in the order it took them, so two calls made at once on two
//! hosts (two pipelines of one name, a move and a delete) cannot both pass their checks.
//!
//! Every answer to such a call names the host that ran it in `x-baton-handled-by`. A host
//! that cannot connect to the controller at all (it died, and the group has not noticed yet)
//! runs the call itself: any host may append to the control log, whose order decides.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState, MODULE_LIMIT};

/// The header a forwarded call carries: the id of the host that forwarded it. A call that
/// carries it runs where it arrives, so that a call is never forwarded twice.
pub const FORWARDED_BY: &str = "x-baton-forwarded-by";
/// The header of a forwarded call with the control-log offset its host had seen: the
/// controller runs the call once it has read the log that far (the module the caller just
/// uploaded there, say).
pub const CONTROL_SEEN: &str = "x-baton-control-seen";
/// How long the controller waits to read the log as far as the forwarding host had.
const CATCH_UP: std::time::Duration = std::time::Duration::from_secs(10);
/// The header naming the host that ran a call that runs on the controller.
pub const HANDLED_BY: &str = "x-baton-handled-by";

/// How long a forwarded call may take (a swap waits for every partition's report).
const FORWARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// True for the calls that run on the controller: those that check the catalog and then change
/// it. Uploads (content-addressed), records, drains (host to host) and reads run anywhere.
pub fn runs_on_controller(method: &Method, path: &str) -> bool {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match segments.as_slice() {
        ["", "api", "v1", "pipelines"] => method == Method::POST,
        ["", "api", "v1", "pipelines", _] => method == Method::DELETE || method == Method::PATCH,
        ["", "api", "v1", "pipelines", _, "module"] => method == Method::PUT,
        ["", "api", "v1", "pipelines", _, "dead-letters", "replay"] => method == Method::POST,
        ["", "api", "v1", "partitions", _, "move"] => method == Method::POST,
        ["", "api", "v1", "balancer", "log"] => method == Method::GET,
        ["", "api", "v1", "modules", _, _] => method == Method::DELETE,
        _ => false,
    }
}

/// The middleware: runs a call here, or forwards it to the controller.
pub(super) async fn to_controller(
    State(baton): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if !runs_on_controller(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    let controller = if req.headers().contains_key(FORWARDED_BY) {
        let seen = req
            .headers()
            .get(CONTROL_SEEN)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        while baton.control_position() < seen {
            if tokio::time::Instant::now() > deadline {
                return ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "host {} has read the control log to offset {}, not yet to {seen} as the host that forwarded the call had; retry",
                        baton.host_id(),
                        baton.control_position()
                    ),
                )
                .into_response();
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        None
    } else {
        controller_with_address(|| baton.other_controller(), ADDRESS_WAIT).await
    };
    let req = match controller {
        None => req,
        Some((id, address)) => {
            let (parts, body) = req.into_parts();
            let bytes = match axum::body::to_bytes(body, MODULE_LIMIT).await {
                Ok(b) => b,
                Err(e) => {
                    return ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("reading the request body: {e}"),
                    )
                    .into_response();
                }
            };
            match forward(&baton, &address, &parts, bytes.clone()).await {
                Ok(r) => return r,
                Err(Forward::NotSent(e)) => {
                    tracing::warn!(
                        controller = %id,
                        "{} {}: the controller ({address}) cannot be reached ({e}); running the call here",
                        parts.method,
                        parts.uri.path()
                    );
                    Request::from_parts(parts, Body::from(bytes))
                }
                Err(Forward::Failed(e)) => {
                    return ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "{} {} runs on the controller, host {id} ({address}), which did not answer: {e}; it may have been applied, check before you retry",
                            parts.method,
                            parts.uri.path()
                        ),
                    )
                    .into_response();
                }
            }
        }
    };
    let mut r = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(baton.host_id()) {
        r.headers_mut().insert(HANDLED_BY, v);
    }
    r
}

/// How long a call waits for the controller's address, when the group names a controller
/// whose first report this host has not read yet (a host that just joined, or just started).
const ADDRESS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The live controller other than this host (as `other` finds it), as (id, address), once its
/// address is known. A controller whose address does not come within `wait` is treated as one
/// that cannot be reached: the call runs here, and the control log's order decides.
async fn controller_with_address(
    other: impl Fn() -> Option<(String, String)>,
    wait: std::time::Duration,
) -> Option<(String, String)> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match other() {
            Some((id, address)) if address.is_empty() => {
                if tokio::time::Instant::now() > deadline {
                    tracing::warn!(
                        controller = %id,
                        "the controller's address is not known after {wait:?}; running the call here"
                    );
                    return None;
                }
            }
            found => return found,
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

pub(super) enum Forward {
    /// The call did not reach the other host.
    NotSent(String),
    /// It reached it (or may have) and no answer came back.
    Failed(String),
}

impl std::fmt::Display for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Forward::NotSent(e) => write!(f, "not sent: {e}"),
            Forward::Failed(e) => write!(f, "no answer: {e}"),
        }
    }
}

/// Sends the call to the controller at `address` with the caller's headers.
async fn forward(
    baton: &AppState,
    address: &str,
    parts: &axum::http::request::Parts,
    body: bytes::Bytes,
) -> Result<Response, Forward> {
    let path = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    send(
        baton,
        address,
        parts.method.clone(),
        path,
        &parts.headers,
        body,
    )
    .await
}

/// Sends a call to the host at `address` (`path` with its query) with the caller's token and
/// content headers, marked as forwarded by this host; its answer, relayed.
pub(super) async fn send(
    baton: &AppState,
    address: &str,
    method: Method,
    path: &str,
    headers: &axum::http::HeaderMap,
    body: bytes::Bytes,
) -> Result<Response, Forward> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let client = CLIENT.get_or_init(reqwest::Client::new);
    let url = format!("{}{path}", address.trim_end_matches('/'));
    let mut req = client
        .request(method, url)
        .timeout(FORWARD_TIMEOUT)
        .header(FORWARDED_BY, baton.host_id())
        .header(CONTROL_SEEN, baton.control_seen())
        .body(body);
    for name in [header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = headers.get(&name) {
            req = req.header(name, v.clone());
        }
    }
    let answer = req.send().await.map_err(|e| {
        if e.is_connect() || e.is_builder() {
            Forward::NotSent(e.to_string())
        } else {
            Forward::Failed(e.to_string())
        }
    })?;
    let status = answer.status();
    let mut headers = Vec::new();
    for name in [
        header::CONTENT_TYPE,
        header::WWW_AUTHENTICATE,
        header::LOCATION,
        HeaderName::from_static(HANDLED_BY),
    ] {
        if let Some(v) = answer.headers().get(&name) {
            headers.push((name, v.clone()));
        }
    }
    let bytes = answer
        .bytes()
        .await
        .map_err(|e| Forward::Failed(e.to_string()))?;
    let mut r = (status, bytes).into_response();
    for (name, v) in headers {
        r.headers_mut().insert(name, v);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calls_that_change_the_catalog_run_on_the_controller() {
        let on = |m: Method, p: &str| runs_on_controller(&m, p);
        assert!(on(Method::POST, "/api/v1/pipelines"));
        assert!(on(Method::POST, "/api/v1/pipelines/"));
        assert!(on(Method::PATCH, "/api/v1/pipelines/p"));
        assert!(on(Method::DELETE, "/api/v1/pipelines/p"));
        assert!(on(Method::PUT, "/api/v1/pipelines/p/module"));
        assert!(on(Method::POST, "/api/v1/pipelines/p/dead-letters/replay"));
        assert!(on(Method::POST, "/api/v1/partitions/p-0/move"));
        assert!(on(Method::DELETE, "/api/v1/modules/m/1"));
        assert!(!on(Method::GET, "/api/v1/pipelines"));
        assert!(!on(Method::POST, "/api/v1/modules"));
        assert!(!on(Method::POST, "/api/v1/partitions/p-0/drain"));
        assert!(!on(Method::POST, "/api/v1/topics/t/records"));
        assert!(!on(Method::GET, "/api/v1/pipelines/p/stores/s/keys/k"));
    }

    #[tokio::test]
    async fn a_call_waits_for_the_controllers_address_and_runs_here_without_one() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let wait = std::time::Duration::from_millis(300);
        // The group names host a before this host has read a's first report: the call waits
        // for the address, and then goes there.
        let asked = AtomicU32::new(0);
        let later = || {
            let n = asked.fetch_add(1, Ordering::Relaxed);
            let address = if n < 5 { "" } else { "http://127.0.0.1:1" };
            Some(("a".to_string(), address.to_string()))
        };
        assert_eq!(
            controller_with_address(later, wait).await,
            Some(("a".to_string(), "http://127.0.0.1:1".to_string()))
        );
        assert_eq!(asked.load(Ordering::Relaxed), 6);
        // An address that never comes: the call runs here once the wait is over, not sooner.
        let start = tokio::time::Instant::now();
        let never = || Some(("a".to_string(), String::new()));
        assert_eq!(controller_with_address(never, wait).await, None);
        assert!(start.elapsed() >= wait);
        // No other controller (this host is the controller): at once.
        let start = tokio::time::Instant::now();
        assert_eq!(controller_with_address(|| None, wait).await, None);
        assert!(start.elapsed() < wait);
    }
}
