//! The error type of the host's operations, shaped for the HTTP layer: each kind maps to a
//! status code and its message tells the caller what was wrong and how to fix it.

/// An error of a host operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed or refers to something invalid (400).
    #[error("{0}")]
    BadRequest(String),
    /// The thing asked for does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with what exists (409).
    #[error("{0}")]
    Conflict(String),
    /// The payload is larger than allowed (413).
    #[error("{0}")]
    TooLarge(String),
    /// The module was refused (422).
    #[error("{0}")]
    InvalidModule(String),
    /// A service the host depends on (the Kafka cluster) is not answering (503).
    #[error("{0}")]
    Unavailable(String),
    /// A fault inside the host (500); the message is logged, not shown.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<crate::state::StateError> for Error {
    fn from(e: crate::state::StateError) -> Self {
        Error::Internal(e.to_string())
    }
}

impl From<crate::transport::TransportError> for Error {
    fn from(e: crate::transport::TransportError) -> Self {
        use crate::transport::TransportError as T;
        match e {
            T::UnknownTopic(_) | T::NoSuchPartition { .. } => Error::NotFound(e.to_string()),
            T::PartitionCountMismatch { .. } | T::Misconfigured(_) => {
                Error::Conflict(e.to_string())
            }
            T::InvalidTopicName(_) => Error::BadRequest(e.to_string()),
            T::Kafka(_) => Error::Unavailable(e.to_string()),
            T::Refused(_) => Error::BadRequest(e.to_string()),
            T::Io(_) | T::Corrupt(_) => Error::Internal(e.to_string()),
        }
    }
}

impl From<crate::runtime::ModuleError> for Error {
    fn from(e: crate::runtime::ModuleError) -> Self {
        match e {
            crate::runtime::ModuleError::Cache(_) => Error::Internal(e.to_string()),
            _ => Error::InvalidModule(e.to_string()),
        }
    }
}

/// Result of host operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
