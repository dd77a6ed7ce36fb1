//! The one error type of the HTTP layer. Bad input gets a 4xx whose JSON body says what was
//! wrong; internal errors are logged and answered with a generic 500.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::Error;

/// An HTTP error: a status and a message for the caller.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    /// A body over the limit of its call, refused by an extractor that does not know the
    /// limit: the router's outer layer names it (see [`BodyOverLimit`]).
    over_limit: bool,
}

/// Marks the answer to a body over its call's limit, for the layer that knows the limit.
#[derive(Debug, Clone, Copy)]
pub struct BodyOverLimit;

impl ApiError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            over_limit: false,
        }
    }

    /// 400 Bad Request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// The same error with a hint on how to fix it appended to the message.
    pub fn with_hint(mut self, hint: &str) -> Self {
        self.message = format!("{}; {hint}", self.message);
        self
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The status code.
    pub fn status_code(&self) -> StatusCode {
        self.status
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::BadRequest(_) => StatusCode::BAD_REQUEST,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
            Error::Conflict(_) => StatusCode::CONFLICT,
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::InvalidModule(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Error::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError {
            status,
            message: e.to_string(),
            over_limit: false,
        }
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("worker failed: {e}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // An internal error's message is for the log; a 503 says what is not available yet.
        let message =
            if self.status.is_server_error() && self.status != StatusCode::SERVICE_UNAVAILABLE {
                tracing::error!(status = self.status.as_u16(), "{}", self.message);
                "internal error; see the host's log".to_string()
            } else {
                self.message
            };
        let mut r = (
            self.status,
            Json(json!({ "error": message, "status": self.status.as_u16() })),
        )
            .into_response();
        if self.over_limit {
            r.extensions_mut().insert(BodyOverLimit);
        }
        r
    }
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    fn from(r: axum::extract::rejection::JsonRejection) -> Self {
        let over_limit = r.status() == StatusCode::PAYLOAD_TOO_LARGE;
        let status = if over_limit {
            r.status()
        } else {
            StatusCode::BAD_REQUEST
        };
        ApiError {
            over_limit,
            ..ApiError::new(status, format!("request body: {}", r.body_text()))
        }
    }
}

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(r: axum::extract::rejection::QueryRejection) -> Self {
        ApiError::bad_request(format!("query string: {}", r.body_text()))
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(r: axum::extract::rejection::PathRejection) -> Self {
        ApiError::bad_request(format!("path: {}", r.body_text()))
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    fn from(r: axum::extract::rejection::BytesRejection) -> Self {
        let over_limit = r.status() == StatusCode::PAYLOAD_TOO_LARGE;
        let status = if over_limit {
            r.status()
        } else {
            StatusCode::BAD_REQUEST
        };
        ApiError {
            over_limit,
            ..ApiError::new(status, format!("request body: {}", r.body_text()))
        }
    }
}
