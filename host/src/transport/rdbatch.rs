//! Batch reads from librdkafka, below rust-rdkafka, and batch writes ([`produce_many`]): the
//! only unsafe code of the transport.
//!
//! rust-rdkafka's `poll` returns one record per call; each call reads the clock, takes the
//! queue's lock and allocates an event handle. At hundreds of thousands of records a second
//! that was about a tenth of a partition thread's time. Here every assigned topic partition's
//! fetch queue is forwarded to one queue of the consumer's own, which
//! `rd_kafka_consume_batch_queue` drains in one call per batch.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use super::Record;

/// The queue that assigned topic partitions' records are forwarded to.
pub(super) struct RecordQueue {
    queue: *mut rd::rd_kafka_queue_t,
    /// The same queue for [`FetchWaker`]s, emptied (under its lock) before the queue goes.
    wakers: Arc<Mutex<Option<QueuePtr>>>,
    /// Wakes so far, counted by the wakers before they wake.
    wakes: Arc<AtomicU64>,
    /// `wakes` as the last [`RecordQueue::consume`] saw it.
    seen: AtomicU64,
}

/// A queue handle that may cross threads.
struct QueuePtr(*mut rd::rd_kafka_queue_t);

// SAFETY: librdkafka's queues are thread-safe; the handle is only destroyed on drop.
unsafe impl Send for RecordQueue {}
unsafe impl Sync for RecordQueue {}
// SAFETY: as above; a `QueuePtr` is only used under its slot's lock, which the queue's drop
// takes before destroying it.
unsafe impl Send for QueuePtr {}

impl Drop for RecordQueue {
    fn drop(&mut self) {
        self.wakers.lock().take();
        // SAFETY: the handle came from rd_kafka_queue_new and is destroyed once, after no
        // waker can reach it. Its owner declares it before the consumer, so it goes first.
        unsafe { rd::rd_kafka_queue_destroy(self.queue) }
    }
}

/// Ends, from another thread, a [`RecordQueue::consume`] waiting for records, or else the next
/// one's wait: a partition's loop told to stop or commit acts at once instead of after its
/// fetch's wait. Does nothing once the queue is gone.
///
/// librdkafka's yield flag alone can be lost: a read that finds the queue empty clears it
/// whether it waits or not, and `consume` reads once without waiting before it waits. So a
/// wake is also counted, and `consume` does not wait when the count moved since its last call.
#[derive(Clone)]
pub struct FetchWaker {
    queue: Arc<Mutex<Option<QueuePtr>>>,
    wakes: Arc<AtomicU64>,
}

impl FetchWaker {
    /// Wakes the queue's reader.
    pub fn wake(&self) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        if let Some(q) = self.queue.lock().as_ref() {
            // SAFETY: the queue is alive while its slot holds it (see `RecordQueue`'s drop).
            unsafe { rd::rd_kafka_queue_yield(q.0) }
        }
    }
}

impl RecordQueue {
    /// A new queue of `consumer`'s client. The owner must drop it before the consumer.
    pub(super) fn new(consumer: &BaseConsumer) -> Self {
        // SAFETY: the client is alive.
        let queue = unsafe { rd::rd_kafka_queue_new(consumer.client().native_ptr()) };
        RecordQueue {
            queue,
            wakers: Arc::new(Mutex::new(Some(QueuePtr(queue)))),
            wakes: Arc::new(AtomicU64::new(0)),
            seen: AtomicU64::new(0),
        }
    }

    /// What wakes this queue's reader from another thread.
    pub(super) fn waker(&self) -> FetchWaker {
        FetchWaker {
            queue: self.wakers.clone(),
            wakes: self.wakes.clone(),
        }
    }

    /// Sends the records of a topic partition here from now on (call before assigning it).
    pub(super) fn forward(
        &self,
        consumer: &BaseConsumer,
        topic: &str,
        partition: u32,
    ) -> Result<(), String> {
        let name = CString::new(topic).map_err(|_| format!("topic name {topic:?} has a NUL"))?;
        // SAFETY: the client outlives this call; the partition queue handle is released at
        // once, and the forwarding stays with the topic partition.
        unsafe {
            let pq = rd::rd_kafka_queue_get_partition(
                consumer.client().native_ptr(),
                name.as_ptr(),
                partition as i32,
            );
            if pq.is_null() {
                return Err(format!("no fetch queue for {topic}/{partition}"));
            }
            rd::rd_kafka_queue_forward(pq, self.queue);
            rd::rd_kafka_queue_destroy(pq);
        }
        Ok(())
    }

    /// Up to `max` messages: those queued at once, else waits up to `wait` for the first
    /// (not at all when a [`FetchWaker`] woke it since the last call).
    /// (`rd_kafka_consume_batch_queue` with a timeout waits until the batch is full: that would
    /// hold each record of a slow input for the whole wait.)
    pub(super) fn consume(&self, max: usize, wait: Duration) -> Vec<RawMessage> {
        let wakes = self.wakes.load(Ordering::SeqCst);
        let woken = self.seen.load(Ordering::Relaxed) != wakes;
        let mut out = self.take(max, 0);
        // A wake counted after `wakes` was read may have had its yield flag cleared by the read
        // just done: it must not be waited through either. One counted after `now` is read
        // sets the flag after it, which ends the wait.
        let now = self.wakes.load(Ordering::SeqCst);
        self.seen.store(now, Ordering::Relaxed);
        if out.is_empty() && !wait.is_zero() && !woken && now == wakes {
            out = self.take(1, wait.as_millis().clamp(1, i32::MAX as u128) as i32);
            if !out.is_empty() && max > 1 {
                out.extend(self.take(max - 1, 0));
            }
        }
        out
    }

    fn take(&self, max: usize, wait_ms: i32) -> Vec<RawMessage> {
        let mut raw: Vec<*mut rd::rd_kafka_message_t> = vec![std::ptr::null_mut(); max];
        // SAFETY: `raw` has room for `max` messages; each one filled in is ours, destroyed by
        // `RawMessage`'s drop.
        let n =
            unsafe { rd::rd_kafka_consume_batch_queue(self.queue, wait_ms, raw.as_mut_ptr(), max) };
        if n < 0 {
            tracing::warn!("input consumer: batch read failed");
            return Vec::new();
        }
        raw.truncate(n as usize);
        raw.into_iter()
            .filter(|p| !p.is_null())
            .map(RawMessage)
            .collect()
    }
}

/// A message of a batch; destroyed on drop.
pub(super) struct RawMessage(*mut rd::rd_kafka_message_t);

impl Drop for RawMessage {
    fn drop(&mut self) {
        // SAFETY: each message of a batch is owned by the caller and destroyed once.
        unsafe { rd::rd_kafka_message_destroy(self.0) }
    }
}

fn bytes(ptr: *const c_void, len: usize) -> Option<Vec<u8>> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: librdkafka guarantees `len` readable bytes at `ptr` for the message's life.
        Some(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec())
    }
}

impl RawMessage {
    fn get(&self) -> &rd::rd_kafka_message_t {
        // SAFETY: non-null (filtered at consume) and alive until drop.
        unsafe { &*self.0 }
    }

    /// The error this message carries instead of a record, if any.
    pub(super) fn error(&self) -> Option<String> {
        let m = self.get();
        (m.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| {
            let text = bytes(m.payload, m.len).unwrap_or_default();
            format!(
                "{}: {}",
                RDKafkaErrorCode::from(m.err),
                String::from_utf8_lossy(&text)
            )
        })
    }

    /// The record's offset.
    pub(super) fn offset(&self) -> u64 {
        self.get().offset.max(0) as u64
    }

    /// The record's partition.
    pub(super) fn partition(&self) -> u32 {
        self.get().partition as u32
    }

    /// Identifies the topic within one consumer, without reading its name.
    pub(super) fn topic_id(&self) -> usize {
        self.get().rkt as usize
    }

    /// The topic's name.
    pub(super) fn topic(&self) -> String {
        // SAFETY: a fetched message always has its topic handle; the name is NUL-terminated.
        unsafe {
            CStr::from_ptr(rd::rd_kafka_topic_name(self.get().rkt))
                .to_string_lossy()
                .into_owned()
        }
    }

    /// The record's key and value, borrowed from librdkafka's buffers.
    pub(super) fn key_value(&self) -> (Option<&[u8]>, Option<&[u8]>) {
        let m = self.get();
        let slice = |ptr: *const c_void, len: usize| {
            // SAFETY: librdkafka guarantees `len` readable bytes at `ptr` for the message's
            // life, which the borrow of `self` bounds.
            (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })
        };
        (slice(m.key, m.key_len), slice(m.payload, m.len))
    }

    /// The record, copied out of librdkafka's buffers.
    pub(super) fn record(&self) -> Record {
        let m = self.get();
        let mut headers = Vec::new();
        let mut hdrs: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
        // SAFETY: the headers belong to the message; names are NUL-terminated, values sized.
        unsafe {
            if rd::rd_kafka_message_headers(self.0, &mut hdrs)
                == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                let mut i = 0;
                loop {
                    let mut name: *const c_char = std::ptr::null();
                    let mut value: *const c_void = std::ptr::null();
                    let mut size = 0usize;
                    if rd::rd_kafka_header_get_all(hdrs, i, &mut name, &mut value, &mut size)
                        != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                    {
                        break;
                    }
                    headers.push((
                        CStr::from_ptr(name).to_string_lossy().into_owned(),
                        bytes(value, size).unwrap_or_default(),
                    ));
                    i += 1;
                }
            }
        }
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: reads the message's own timestamp.
        let ts = unsafe { rd::rd_kafka_message_timestamp(self.0, &mut kind) };
        Record {
            key: bytes(m.key, m.key_len),
            value: bytes(m.payload, m.len),
            headers,
            timestamp: if kind == rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE {
                0
            } else {
                ts
            },
        }
    }
}

/// Why [`produce_many`] failed.
#[derive(Debug)]
pub(super) enum ProduceError {
    /// No topic handle: a NUL in its name, or librdkafka refused it.
    Topic,
    /// librdkafka refused a record: the first such, by its code.
    Record { code: RDKafkaErrorCode },
}

/// Enqueues `records`, `(key, value)` each, without headers, to `topic`/`partition` with
/// `rd_kafka_produce_batch`: one topic handle, one partition lookup and one clock read for all
/// of them. Sent one by one through rust-rdkafka, each record looked its topic up by name under
/// the client's lock, parsed a list of arguments and read the clock: at 10M keys, where a commit
/// holds a changelog record per input record, that was 9% of the host's CPU (a third of the
/// committer's); in one call it is 4%.
///
/// One partition per call: librdkafka's path for records that name their partitions adds
/// "the partition not yet known" to a transaction when the producer has no metadata of the
/// topic yet, where the path for one partition holds them until it knows the topic, as
/// sending one by one does.
///
/// `pending` counts records enqueued and not yet delivered, as the producer's delivery callback
/// (which expects no opaque) counts them down. A full queue is waited out, up to `patience`;
/// any other refusal fails the call (the records before it may be enqueued: the caller's
/// transaction is aborted).
pub(super) fn produce_many<'a, C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    pending: &AtomicUsize,
    topic: &str,
    partition: u32,
    records: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    patience: Duration,
) -> Result<(), ProduceError> {
    let mut msgs: Vec<rd::rd_kafka_message_t> = records
        .into_iter()
        .map(|(key, value)| {
            // SAFETY: a plain C struct, for which all zeroes is a valid value (null pointers).
            let mut m: rd::rd_kafka_message_t = unsafe { std::mem::zeroed() };
            m.key = key.as_ptr() as *mut c_void;
            m.key_len = key.len();
            if let Some(v) = value {
                m.payload = v.as_ptr() as *mut c_void;
                m.len = v.len();
            }
            m
        })
        .collect();
    if msgs.is_empty() {
        return Ok(());
    }
    let name = CString::new(topic).map_err(|_| ProduceError::Topic)?;
    // SAFETY: the client is alive for the call; the handle taken is given back by `TopicRef`.
    let rkt =
        unsafe { rd::rd_kafka_topic_new(client.native_ptr(), name.as_ptr(), std::ptr::null_mut()) };
    if rkt.is_null() {
        return Err(ProduceError::Topic);
    }
    struct TopicRef(*mut rd::rd_kafka_topic_t);
    impl Drop for TopicRef {
        fn drop(&mut self) {
            // SAFETY: taken by `rd_kafka_topic_new`, given back once.
            unsafe { rd::rd_kafka_topic_destroy(self.0) }
        }
    }
    let rkt = TopicRef(rkt);
    let ok =
        |m: &rd::rd_kafka_message_t| m.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
    let deadline = Instant::now() + patience;
    let mut from = 0;
    while from < msgs.len() {
        let chunk = &mut msgs[from..];
        // Counted before any of them can be delivered.
        pending.fetch_add(chunk.len(), Ordering::AcqRel);
        // SAFETY: the keys and values outlive the call, which copies them
        // (`RD_KAFKA_MSG_F_COPY`); the messages carry no opaque.
        let taken = unsafe {
            rd::rd_kafka_produce_batch(
                rkt.0,
                partition as i32,
                rd::RD_KAFKA_MSG_F_COPY,
                chunk.as_mut_ptr(),
                chunk.len() as i32,
            )
        };
        let taken = usize::try_from(taken).unwrap_or(0).min(chunk.len());
        pending.fetch_sub(chunk.len() - taken, Ordering::AcqRel);
        if taken == chunk.len() {
            return Ok(());
        }
        let code = |m: &rd::rd_kafka_message_t| RDKafkaErrorCode::from(m.err);
        if let Some(m) = chunk
            .iter()
            .find(|m| !ok(m) && code(m) != RDKafkaErrorCode::QueueFull)
        {
            return Err(ProduceError::Record { code: code(m) });
        }
        // A full queue: the records from the first one refused on were all refused.
        let first = chunk.iter().position(|m| !ok(m)).unwrap_or(chunk.len());
        if first == chunk.len() || Instant::now() >= deadline {
            return Err(ProduceError::Record {
                code: RDKafkaErrorCode::QueueFull,
            });
        }
        for m in &mut chunk[first..] {
            m.err = rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
        }
        from += first;
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}
