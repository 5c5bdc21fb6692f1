//! One world, one declaration: every rank's [`Capabilities`] compared with rank 0's at the
//! world's setup ([clause: init.same_capabilities]). The suites' gates, value checks and probes
//! read the declaration on each rank alone; a backend that derives it from the local device
//! (half types on some architectures only, the NaN rule of the local kernel, a library version
//! that differs between containers) declares differently on different ranks, and then one rank
//! skips a case its peers run (a hang named after the wrong rank) or, with each rank doing what
//! it declares, the ranks of one job hold different results for one call while every rank's own
//! checks accept.
//!
//! One store round per world, never per case: rank 0 posts its declaration, every other rank
//! reads it (waiting for it with the setup deadline) and compares. The runner's worlds and
//! externally launched ranks (the suites' `init_state`, torchrun / mpirun worlds included) and
//! the bench's launched ranks call [`same_on_every_rank`] right after `init`.

use concord_core::Capabilities;
use concord_store::Store;
use serde_json::Value;
use std::time::Duration;

/// The store key of rank 0's declaration.
pub const KEY: &str = "concord/capabilities/0";

/// What is compared: the declaration as JSON, with what cannot differ in effect inside a world of
/// `world_size` ranks made equal — `max_world_size` read up to the world's size (a GPU backend
/// declaring its host's GPU count: hosts of another size declare another number, the same for
/// every group of this world), the dtypes as a set, and the gaps as a set without their reasons
/// (text, which may name the local device).
pub fn normalized(caps: &Capabilities, world_size: usize) -> Value {
    let mut v = serde_json::to_value(caps).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        if let Some(Value::Number(n)) = m.get("max_world_size") {
            let max = n.as_u64().unwrap_or(u64::MAX).min(world_size as u64);
            m.insert("max_world_size".into(), Value::from(max));
        }
        for (field, drop) in [("dtypes", None), ("gaps", Some("reason"))] {
            if let Some(Value::Array(items)) = m.get_mut(field) {
                if let Some(key) = drop {
                    for it in items.iter_mut() {
                        if let Value::Object(o) = it {
                            o.remove(key);
                        }
                    }
                }
                items.sort_by_key(|a| a.to_string());
                items.dedup();
            }
        }
    }
    v
}

/// The fields of `mine` (this rank's, [`normalized`]) that differ from `theirs` (rank 0's),
/// each with both values, by field name.
pub fn differences(mine: &Value, theirs: &Value) -> Vec<(String, String, String)> {
    let text = |v: Option<&Value>| v.map_or_else(|| "(absent)".to_string(), |v| v.to_string());
    match (mine, theirs) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().collect();
            keys.extend(b.keys().filter(|k| !a.contains_key(*k)));
            keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).map(|k| (k.clone(), text(a.get(k)), text(b.get(k)))).collect()
        }
        _ if mine == theirs => Vec::new(),
        _ => vec![("(declaration)".into(), mine.to_string(), theirs.to_string())],
    }
}

/// Rank 0 posts its declaration; every other rank waits for it (up to `timeout`) and compares.
/// `Err` is the named setup failure (backend `label`, world size, rank, every differing field
/// with both values, the clause), or the store's error.
pub fn same_on_every_rank(
    store: &Store,
    rank: usize,
    world_size: usize,
    caps: &Capabilities,
    label: &str,
    timeout: Duration,
) -> Result<(), String> {
    if world_size < 2 {
        return Ok(());
    }
    let mine = normalized(caps, world_size);
    let head =
        format!("rank {rank}: backend={label} op=init variant=- dtype=- world_size={world_size} rank={rank}: init.same_capabilities");
    if rank == 0 {
        return store.set(KEY, mine.to_string().as_bytes()).map_err(|e| format!("{head}: cannot post rank 0's capabilities: {e}"));
    }
    let theirs = store
        .wait(&[KEY], timeout)
        .and_then(|()| store.get(KEY))
        .map_err(|e| format!("{head}: rank 0's capabilities never arrived (waited {} ms): {e}", timeout.as_millis()))?;
    let theirs: Value = serde_json::from_slice(&theirs).map_err(|e| format!("{head}: rank 0's capabilities do not parse: {e}"))?;
    let diff = differences(&mine, &theirs);
    if diff.is_empty() {
        return Ok(());
    }
    let each: Vec<String> = diff.iter().map(|(f, a, b)| format!("{f}: rank {rank} declares {a}, rank 0 declares {b}")).collect();
    Err(format!(
        "{head}: rank {rank} and rank 0 declare different capabilities ({}): every rank of a world MUST declare the same \
         capabilities (the suites gate and check every rank by its own declaration, so a per-rank declaration — the local \
         device's NaN rule, its dtypes, a library version — gives the ranks different results or different gates for one call)",
        each.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use concord_core::{DType, Gap, NanPolicy, OpKind};

    #[test]
    fn only_what_differs_in_effect_is_named() {
        let a = Capabilities::full(8);
        let mut b = Capabilities::full(16);
        // Both above a world of 4: the same in effect.
        assert!(differences(&normalized(&a, 4), &normalized(&b, 4)).is_empty());
        // A gap's reason and the order of gaps and dtypes do not count.
        let mut a2 = a.clone();
        a2.gaps = vec![Gap::op(OpKind::Broadcast, "no broadcast on this device"), Gap::reduce("band", "x")];
        b.gaps = vec![Gap::reduce("band", "y"), Gap::op(OpKind::Broadcast, "no broadcast on GPU 3")];
        b.dtypes.reverse();
        assert!(differences(&normalized(&a2, 4), &normalized(&b, 4)).is_empty());
        // Below the world's size, and a NaN rule, do.
        b.nan_minmax = NanPolicy::Ignore;
        b.dtypes.retain(|d| *d != DType::BF16);
        let d = differences(&normalized(&a2, 16), &normalized(&b, 16));
        let fields: Vec<&str> = d.iter().map(|(f, _, _)| f.as_str()).collect();
        assert_eq!(fields, ["dtypes", "max_world_size", "nan_minmax"], "{d:?}");
        let nan = &d[2];
        assert_eq!((nan.1.as_str(), nan.2.as_str()), ("\"Propagate\"", "\"Ignore\""));
    }
}
