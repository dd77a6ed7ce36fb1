//! Names: the one place for what a cluster, pipeline, store, module or topic may be called, and
//! for the names baton keeps for itself.
//!
//! A cluster named `C` owns every Kafka name starting with `C.`: its control log, module chunks,
//! hosts group and load topic, and each pipeline's changelogs, dead letters, consumer group and
//! transactional ids (`C.<pipeline>…`). So no pipeline may read or write a topic under `C.`
//! (nor under `baton.`, the default cluster's prefix), and no pipeline may take a name whose
//! group `C.<name>` would be one of the cluster's own.

/// Pipeline names that would make a pipeline's group or topics collide with the cluster's own
/// (`<cluster>.hosts`, `<cluster>.control`, …).
pub const RESERVED_PIPELINE_NAMES: [&str; 5] =
    ["hosts", "control", "controller", "modules", "load"];

/// The prefix of the default cluster, reserved whatever the cluster is called.
pub const DEFAULT_CLUSTER: &str = "baton";

/// True for 1 to `max` ASCII letters, digits, `-` and `_`.
pub fn is_simple_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// True for 1 to 64 ASCII letters, digits, `-`, `_` and `.` (cluster names, module names and
/// versions).
pub fn is_dotted_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Checks a cluster name.
pub fn check_cluster(cluster: &str) -> Result<(), String> {
    if is_dotted_name(cluster) {
        Ok(())
    } else {
        Err(format!(
            "invalid cluster name `{cluster}`: use 1 to 64 ASCII letters, digits, '-', '_' and '.'"
        ))
    }
}

/// Checks a pipeline name against the cluster's reserved names.
pub fn check_pipeline_name(name: &str) -> Result<(), String> {
    if !is_simple_name(name, 64) {
        return Err(format!(
            "invalid pipeline name `{name}`: use 1 to 64 ASCII letters, digits, '-' and '_'"
        ));
    }
    if RESERVED_PIPELINE_NAMES.contains(&name) {
        return Err(format!(
            "pipeline name `{name}` is reserved for the cluster's own topics and groups \
             (reserved: {}); choose another name",
            RESERVED_PIPELINE_NAMES.join(", ")
        ));
    }
    Ok(())
}

/// Refuses a user topic (a pipeline's input or output, a produce request) under the cluster's
/// prefix or the default cluster's.
pub fn check_user_topic(cluster: &str, topic: &str) -> Result<(), String> {
    for prefix in [cluster, DEFAULT_CLUSTER] {
        if topic
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.'))
        {
            return Err(format!(
                "topic `{topic}`: names starting with `{prefix}.` are reserved for baton's own \
                 topics (control log, modules, changelogs, dead letters); use another name"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_prefix_and_names_are_reserved() {
        assert!(check_user_topic("foo", "foo.control").is_err());
        assert!(check_user_topic("foo", "baton.control").is_err());
        assert!(check_user_topic("foo", "foo.wc.counts.changelog").is_err());
        assert!(check_user_topic("foo", "foobar").is_ok());
        assert!(check_user_topic("foo", "food.x").is_ok());
        assert!(check_user_topic("a.b", "a.b.control").is_err());
        for n in RESERVED_PIPELINE_NAMES {
            assert!(check_pipeline_name(n).unwrap_err().contains("reserved"));
        }
        assert!(check_pipeline_name("wc").is_ok());
        assert!(check_pipeline_name("a.b").is_err());
        assert!(check_cluster("prod.eu-1").is_ok());
        assert!(check_cluster("").is_err());
    }
}
