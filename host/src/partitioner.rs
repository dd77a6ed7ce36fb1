//! The partitioners of Kafka's clients, so that a key's slot can be found whoever produced it:
//! murmur2 is the Java client's default (and baton's, when it produces), CRC32 is the default of
//! every librdkafka-based client (`consistent_random`: Python, Go, C, .NET, Rust's rdkafka).

/// Kafka's murmur2 hash (`org.apache.kafka.common.utils.Utils.murmur2`).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= (tail[2] as u32) << 16;
            h ^= (tail[1] as u32) << 8;
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        2 => {
            h ^= (tail[1] as u32) << 8;
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        1 => {
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition (slot) of `key` among `partitions`: `toPositive(murmur2(key)) % partitions`.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    ((murmur2(key) & 0x7fff_ffff) as u32) % partitions.max(1)
}

/// The partition (slot) librdkafka's default partitioner gives a keyed record:
/// `crc32(key) % partitions` (`consistent_random` hashes keys with CRC-32 and randomises only
/// records without a key).
pub fn crc32_partition_for_key(key: &[u8], partitions: u32) -> u32 {
    crc32fast::hash(key) % partitions.max(1)
}

/// How a pipeline's producers place keys, so that a lookup knows where to look (`partitioner` in
/// the pipeline spec).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Partitioner {
    /// Java clients' default (and baton's produce API): a lookup reads one slot.
    Murmur2,
    /// librdkafka clients' default: a lookup reads one slot.
    Crc32,
    /// Producers of any kind (default): a lookup reads the murmur2 slot first, then every other.
    #[default]
    Any,
}

impl Partitioner {
    /// The slots where `key` may be, in the order a lookup reads them.
    pub fn slots_for_key(self, key: &[u8], slots: u32) -> Vec<u32> {
        let murmur = partition_for_key(key, slots);
        match self {
            Partitioner::Murmur2 => vec![murmur],
            Partitioner::Crc32 => vec![crc32_partition_for_key(key, slots)],
            Partitioner::Any => {
                let crc = crc32_partition_for_key(key, slots);
                let mut v = vec![murmur];
                if crc != murmur {
                    v.push(crc);
                }
                v.extend((0..slots).filter(|s| *s != murmur && *s != crc));
                v
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_librdkafka() {
        // librdkafka's rd_crc32 is the IEEE CRC-32 (zlib's): crc32("123456789") = 0xCBF43926.
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_partition_for_key(b"123456789", 7), 0xCBF4_3926 % 7);
        let any = Partitioner::Any.slots_for_key(b"k", 8);
        assert_eq!(any.len(), 8);
        assert_eq!(any[0], partition_for_key(b"k", 8));
        let mut sorted = any.clone();
        sorted.sort();
        assert_eq!(sorted, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn matches_kafka_reference_values() {
        // Values from Kafka's UtilsTest.testMurmur2.
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58897971
        );
        assert_eq!(murmur2(b"abc"), 479470107);
    }

    #[test]
    fn partition_is_in_range() {
        for n in 1..50u32 {
            for k in 0..100u32 {
                assert!(partition_for_key(&k.to_be_bytes(), n) < n);
            }
        }
    }
}
