//! State queries: lookups and scans of a pipeline's stores, answered from the partition that
//! owns each slot, and the seam that says which host that is.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::control::{Catalog, PipelineRecord};
use crate::error::{Error, Result};
use crate::http::model::{Lookup, LookupMatch, ScanPage};
use crate::partition::Phase;
use crate::partition::peers::Peers;
use crate::partition::supervisor::PartitionHandle;
use crate::state::slot_key;

/// Where a slot's state lives, as an [`OwnerResolver`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This host.
    Local,
    /// Another host of the cluster, reachable at `url`.
    Remote {
        /// Its host id.
        host: String,
        /// Its API's base URL.
        url: String,
    },
}

/// Answers which host owns a pipeline's slot, so that state queries can be sent there. Today a
/// cluster has one host and the answer is always [`Owner::Local`]; multi-host clusters plug a
/// resolver over the partition table here.
pub trait OwnerResolver: Send + Sync {
    /// The owner of `slot` of `pipeline`.
    fn owner(&self, pipeline: &str, slot: u32) -> Owner;
}

/// The single-host resolver.
pub struct LocalResolver;

impl OwnerResolver for LocalResolver {
    fn owner(&self, _pipeline: &str, _slot: u32) -> Owner {
        Owner::Local
    }
}

/// The base URL of a host of the cluster, by its id, as membership knows it.
pub type AddressOf = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The resolver of a cluster on Kafka: a slot's owner is the host its partition is assigned
/// to, reached at the address it reports.
pub struct ClusterResolver {
    catalog: Arc<Mutex<Catalog>>,
    host_id: String,
    address_of: AddressOf,
}

impl ClusterResolver {
    /// Over the host's catalog; `address_of` finds another host's address.
    pub fn new(catalog: Arc<Mutex<Catalog>>, host_id: String, address_of: AddressOf) -> Self {
        ClusterResolver {
            catalog,
            host_id,
            address_of,
        }
    }
}

impl OwnerResolver for ClusterResolver {
    fn owner(&self, pipeline: &str, slot: u32) -> Owner {
        let owner = self
            .catalog
            .lock()
            .assignments
            .values()
            .find(|a| a.pipeline == pipeline && a.slots[0] <= slot && slot < a.slots[1])
            .map(|a| a.owner.clone());
        match owner {
            Some(host) if host != self.host_id => {
                let url = (self.address_of)(&host).unwrap_or_default();
                Owner::Remote { host, url }
            }
            _ => Owner::Local,
        }
    }
}

/// State queries over the host's catalog and its partitions' databases, sent to the owning
/// host where another one owns a slot. Narrow handles: it needs nothing else of the host.
pub struct Queries {
    catalog: Arc<Mutex<Catalog>>,
    peers: Arc<Peers>,
    host_id: String,
    resolver: Box<dyn OwnerResolver>,
}

impl Queries {
    /// Queries answered from `peers`' partitions, with `resolver` saying who owns a slot.
    pub fn new(
        catalog: Arc<Mutex<Catalog>>,
        peers: Arc<Peers>,
        host_id: String,
        resolver: Box<dyn OwnerResolver>,
    ) -> Self {
        Queries {
            catalog,
            peers,
            host_id,
            resolver,
        }
    }

    fn pipeline(&self, name: &str) -> Result<PipelineRecord> {
        self.catalog.lock().pipeline(name)
    }

    /// Looks up `key` in `store` of `pipeline`: `Ok(None)` when the key is missing. Without
    /// `slot`, the slots the pipeline's partitioner allows are read (with `any`, the murmur2
    /// slot first, then every other), and every slot holding the key is in `matches`.
    pub fn lookup(
        &self,
        pipeline: &str,
        store: &str,
        key: &[u8],
        slot: Option<u32>,
    ) -> Result<Option<Lookup>> {
        let record = self.pipeline(pipeline)?;
        let store_id = store_id(&record, store)?;
        let slots = match slot {
            Some(s) if s >= record.spec.slots => {
                return Err(Error::BadRequest(format!(
                    "slot {s} does not exist: pipeline `{pipeline}` has slots 0 to {}",
                    record.spec.slots - 1
                )));
            }
            Some(s) => vec![s],
            None => record
                .spec
                .partitioner
                .slots_for_key(key, record.spec.slots),
        };
        let mut found: Option<Lookup> = None;
        // A partition that lacks the key but has not restored its state yet.
        let mut restoring_without: Option<String> = None;
        for slot in slots {
            let entry = match self.resolver.owner(pipeline, slot) {
                Owner::Remote { host, url } => {
                    match remote_lookup(&host, &url, pipeline, store, key, slot)? {
                        Some(entry) => entry,
                        None => continue,
                    }
                }
                Owner::Local => {
                    let handle = self.local_owner(pipeline, slot)?;
                    let ready = readiness(&handle)?;
                    let Some(value) = handle.db.get(store_id, &slot_key(slot, key))? else {
                        if ready == Readiness::Restoring {
                            // Missing here, perhaps only until the restore reaches it.
                            restoring_without.get_or_insert(handle.id.clone());
                        }
                        continue;
                    };
                    self.entry(&handle, slot, key, value, ready)
                }
            };
            let m = LookupMatch {
                slot,
                partition: entry.partition.clone(),
                owner: entry.owner.clone(),
                value: entry.value.clone(),
                value_base64: entry.value_base64.clone(),
                value_i64: entry.value_i64,
            };
            found.get_or_insert(entry).matches.push(m);
        }
        if let (None, Some(partition)) = (&found, restoring_without) {
            return Err(Error::Unavailable(format!(
                "partition {partition} of `{pipeline}` is restoring its state: key `{}` may be \
                 there once it has; ask again",
                String::from_utf8_lossy(key)
            )));
        }
        Ok(found)
    }

    /// The local partition owning `slot`, or why the query cannot be answered here.
    fn local_owner(&self, pipeline: &str, slot: u32) -> Result<Arc<PartitionHandle>> {
        if let Owner::Remote { host, url } = self.resolver.owner(pipeline, slot) {
            return Err(Error::Unavailable(format!(
                "slot {slot} of `{pipeline}` is owned by host {host} ({url}); ask it there"
            )));
        }
        self.peers
            .handles()
            .into_iter()
            .find(|h| h.pipeline == pipeline && h.slots.contains(&slot))
            .ok_or_else(|| {
                Error::Unavailable(format!("no partition of `{pipeline}` owns slot {slot} yet"))
            })
    }

    fn entry(
        &self,
        handle: &PartitionHandle,
        slot: u32,
        key: &[u8],
        value: Vec<u8>,
        ready: Readiness,
    ) -> Lookup {
        use base64::Engine as _;
        Lookup {
            key: String::from_utf8_lossy(key).into_owned(),
            value: String::from_utf8(value.clone()).ok(),
            value_base64: base64::engine::general_purpose::STANDARD.encode(&value),
            value_i64: <[u8; 8]>::try_from(value.as_slice())
                .ok()
                .map(i64::from_be_bytes),
            slot,
            partition: handle.id.clone(),
            owner: self.host_id.clone(),
            restoring: ready == Readiness::Restoring,
            matches: Vec::new(),
        }
    }

    /// Keys of `store` starting with `prefix`, in (slot, key) order, `limit` at a time from
    /// `cursor` (the `next_cursor` of the previous page).
    pub fn scan(
        &self,
        pipeline: &str,
        store: &str,
        prefix: &[u8],
        limit: usize,
        cursor: Option<&str>,
        only_slot: Option<u32>,
    ) -> Result<ScanPage> {
        let record = self.pipeline(pipeline)?;
        let store_id = store_id(&record, store)?;
        let bad_cursor = || {
            Error::BadRequest(
                "invalid cursor: pass the `next_cursor` of the previous page unchanged".into(),
            )
        };
        let (first_slot, after) = match cursor {
            None => (0, None),
            Some(c) => {
                let (slot, key) = c.split_once(':').ok_or_else(bad_cursor)?;
                let slot: u32 = slot.parse().map_err(|_| bad_cursor())?;
                let key = hex::decode(key).map_err(|_| bad_cursor())?;
                if slot >= record.spec.slots || !key.starts_with(prefix) {
                    return Err(bad_cursor());
                }
                (slot, Some(key))
            }
        };
        if let Some(s) = only_slot
            && (s >= record.spec.slots || (cursor.is_some() && s != first_slot))
        {
            return Err(Error::BadRequest(format!(
                "slot {s}: pipeline `{pipeline}` has slots 0 to {}, and a cursor must be of \
                 that slot",
                record.spec.slots - 1
            )));
        }
        let slots = match only_slot {
            Some(s) => s..s + 1,
            None => first_slot..record.spec.slots,
        };
        let mut items = Vec::new();
        let mut last: Option<String> = None;
        let mut restoring = false;
        for slot in slots {
            if items.len() == limit {
                break;
            }
            if let Owner::Remote { host, url } = self.resolver.owner(pipeline, slot) {
                // That slot's page from its owner, from where the cursor says.
                let want = limit - items.len();
                let from = after
                    .as_ref()
                    .filter(|_| slot == first_slot)
                    .map(|k| format!("{slot}:{}", hex::encode(k)));
                let page = remote_scan(
                    &host,
                    &url,
                    pipeline,
                    store,
                    prefix,
                    want,
                    slot,
                    from.as_deref(),
                )?;
                restoring |= page.restoring;
                let full = page.items.len() == want;
                items.extend(page.items);
                if full {
                    last = page.next_cursor;
                }
                continue;
            }
            let handle = self.local_owner(pipeline, slot)?;
            let ready = readiness(&handle)?;
            restoring |= ready == Readiness::Restoring;
            let start = match &after {
                Some(k) if slot == first_slot => {
                    let mut s = slot_key(slot, k);
                    s.push(0); // the smallest key after the cursor
                    s
                }
                _ => slot_key(slot, prefix),
            };
            let end = match prefix_end(prefix) {
                Some(p) => slot_key(slot, &p),
                None => slot_key(slot + 1, &[]),
            };
            for (k, v) in handle
                .db
                .scan(store_id, &start, &end, limit - items.len())?
            {
                items.push(self.entry(&handle, slot, &k[4..], v, ready));
                last = Some(format!("{slot}:{}", hex::encode(&k[4..])));
            }
        }
        let next_cursor = (items.len() == limit).then_some(last).flatten();
        Ok(ScanPage {
            items,
            next_cursor,
            restoring,
        })
    }
}

/// How far a local partition's state can be trusted by a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Readiness {
    /// Its loop restored the state and ran: the state is current as of its last batch.
    Current,
    /// No session of its loop has restored the state yet: what the database holds may be
    /// older than the changelogs (phases `starting` and `restoring`).
    Restoring,
}

/// A partition's [`Readiness`], or a 503 when it has stopped here: drained for a move, its
/// state is its next owner's to answer for.
fn readiness(h: &PartitionHandle) -> Result<Readiness> {
    if matches!(*h.status.phase.lock(), Phase::Stopped) {
        return Err(Error::Unavailable(format!(
            "partition {} of `{}` has stopped on this host (it is moving or stopping); ask \
             again",
            h.id, h.pipeline
        )));
    }
    Ok(
        if h.status.restored.load(std::sync::atomic::Ordering::Acquire) {
            Readiness::Current
        } else {
            Readiness::Restoring
        },
    )
}

/// The smallest byte string greater than every string starting with `prefix`, or `None` when
/// there is none (empty prefix, or all 0xff).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The index of `store` among the pipeline's stores, or a 404 naming the ones it has.
fn store_id(record: &PipelineRecord, store: &str) -> Result<usize> {
    record
        .spec
        .stores
        .iter()
        .position(|s| s == store)
        .ok_or_else(|| {
            Error::NotFound(format!(
                "pipeline `{}` has no store `{store}`; its stores: [{}]",
                record.spec.name,
                record.spec.stores.join(", ")
            ))
        })
}

/// The header of a lookup's 404 that says the key is missing (and not the pipeline or the
/// store): `baton-missing: key`.
pub const MISSING_HEADER: &str = "baton-missing";

/// How long a host waits for another to answer a lookup.
const REMOTE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// GETs `path` (segments under the base URL `url`) with `query` from `host`, the owner of
/// `slot` of `pipeline`: its JSON answer, `None` for a 404 that says the key is missing, and a
/// 503 naming the host when it cannot answer. One HTTP client serves every such call, so connections are reused.
fn ask_owner<T: serde::de::DeserializeOwned>(
    (host, url): (&str, &str),
    pipeline: &str,
    slot: u32,
    path: &[&str],
    query: &[(&str, &str)],
) -> Result<Option<T>> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let unavailable = |why: String| {
        Error::Unavailable(format!(
            "host {host} ({url}) owns slot {slot} of `{pipeline}` and could not answer: {why}"
        ))
    };
    let mut u = reqwest::Url::parse(url).map_err(|e| unavailable(format!("bad address: {e}")))?;
    u.path_segments_mut()
        .map_err(|_| unavailable("bad address".into()))?
        .extend(path);
    u.query_pairs_mut().extend_pairs(query);
    let fetch = async move {
        let r = CLIENT
            .get_or_init(reqwest::Client::new)
            .get(u)
            .timeout(REMOTE_TIMEOUT)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        match r.status().as_u16() {
            // Only a missing key is "not there": a 404 for the pipeline or the store means
            // the owner has not read the control log that far.
            404 if r.headers().get(MISSING_HEADER).is_some_and(|v| v == "key") => Ok(None),
            200 => r.json::<T>().await.map(Some).map_err(|e| e.to_string()),
            s => Err(format!("{s} {}", r.text().await.unwrap_or_default())),
        }
    };
    let answer = match tokio::runtime::Handle::try_current() {
        Ok(h) => tokio::task::block_in_place(|| h.block_on(fetch)),
        Err(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| unavailable(e.to_string()))?
            .block_on(fetch),
    };
    answer.map_err(unavailable)
}

/// `key` in `slot`, from `host`, the slot's owner: `None` when it does not hold the key.
fn remote_lookup(
    host: &str,
    url: &str,
    pipeline: &str,
    store: &str,
    key: &[u8],
    slot: u32,
) -> Result<Option<Lookup>> {
    let key = std::str::from_utf8(key)
        .map_err(|_| Error::BadRequest("a key asked of another host must be UTF-8".into()))?;
    let path = [
        "api",
        "v1",
        "pipelines",
        pipeline,
        "stores",
        store,
        "keys",
        key,
    ];
    let slot_text = slot.to_string();
    let mut entry: Option<Lookup> =
        ask_owner((host, url), pipeline, slot, &path, &[("slot", &slot_text)])?;
    if let Some(e) = &mut entry {
        e.matches.clear();
    }
    Ok(entry)
}

/// A page of one slot of a scan, from `host`, the slot's owner.
#[allow(clippy::too_many_arguments)]
fn remote_scan(
    host: &str,
    url: &str,
    pipeline: &str,
    store: &str,
    prefix: &[u8],
    limit: usize,
    slot: u32,
    cursor: Option<&str>,
) -> Result<ScanPage> {
    let prefix = std::str::from_utf8(prefix)
        .map_err(|_| Error::BadRequest("a scan prefix must be UTF-8".into()))?;
    let path = ["api", "v1", "pipelines", pipeline, "stores", store, "keys"];
    let (limit, slot_text) = (limit.to_string(), slot.to_string());
    let mut query = vec![("prefix", prefix), ("limit", &limit), ("slot", &slot_text)];
    if let Some(c) = cursor {
        query.push(("cursor", c));
    }
    ask_owner((host, url), pipeline, slot, &path, &query)?.ok_or_else(|| {
        Error::Unavailable(format!(
            "host {host} ({url}) owns slot {slot} of `{pipeline}` and answered 404 to a scan"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on 127.0.0.1 answering `/gone` with a missing key's 404 and `/unknown` with a
    /// 404 without the header (an owner that does not know the pipeline); its base URL.
    fn owner() -> String {
        use axum::http::StatusCode;
        use axum::response::IntoResponse;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let app = axum::Router::new()
                    .route(
                        "/gone",
                        axum::routing::get(|| async {
                            (StatusCode::NOT_FOUND, [(MISSING_HEADER, "key")], "{}").into_response()
                        }),
                    )
                    .route(
                        "/unknown",
                        axum::routing::get(|| async {
                            (StatusCode::NOT_FOUND, "pipeline `p` does not exist").into_response()
                        }),
                    );
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(format!("http://{}", l.local_addr().unwrap()))
                    .unwrap();
                axum::serve(l, app).await.unwrap();
            });
        });
        rx.recv().unwrap()
    }

    #[test]
    fn only_a_missing_keys_404_from_the_owner_reads_as_no_such_key() {
        let url = owner();
        let got: Result<Option<serde_json::Value>> =
            ask_owner(("h2", &url), "p", 3, &["gone"], &[]);
        assert!(matches!(got, Ok(None)), "{got:?}");
        let got: Result<Option<serde_json::Value>> =
            ask_owner(("h2", &url), "p", 3, &["unknown"], &[]);
        match got {
            Err(Error::Unavailable(m)) => {
                assert!(m.contains("h2") && m.contains("does not exist"), "{m}")
            }
            other => panic!("a 404 for the pipeline is not a missing key: {other:?}"),
        }
    }
}
