//! `/api/v1/host`: this host's transport and its shared RocksDB memory; `/api/v1/hosts`: the
//! hosts of the cluster.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::AppState;

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/api/v1/host", get(show))
        .route("/api/v1/hosts", get(hosts))
}

async fn hosts(State(baton): State<AppState>) -> Json<Vec<crate::cluster::HostInfo>> {
    Json(baton.hosts())
}

async fn show(State(baton): State<AppState>) -> Json<Value> {
    let env = baton.state_env();
    Json(json!({
        "id": baton.host_id(),
        "transport": baton.transport().kind(),
        "cluster": baton.config().cluster,
        "partitions": baton.partitions().len(),
        "control": {
            "replay": baton.control_replay(),
            "snapshot_every": baton.config().control_snapshot_every,
        },
        "state_memory": env.report(),
        "heap": crate::heap::report(),
    }))
}
