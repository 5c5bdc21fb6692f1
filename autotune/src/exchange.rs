//! The one agreement primitive: publish, read every rank's with the deadline, decide by
//! `compare_set` (first writer wins; everyone adopts the stored value).

use concord_store::{Store, StoreError};
use std::time::{Duration, Instant};

/// Publishes `mine` at `<prefix>/<rank>`, reads every rank's value (waiting up to `deadline`),
/// and proposes that view at `<prefix>/decision` with `compare_set`; returns the stored view
/// (index = rank, `None` = not there by the deadline of the rank that decided). A rank that
/// arrives after the decision adopts it without waiting.
pub(crate) fn exchange(
    store: &Store,
    prefix: &str,
    rank: usize,
    ws: usize,
    mine: &str,
    deadline: Instant,
) -> Result<Vec<Option<String>>, StoreError> {
    let dkey = format!("{prefix}/decision");
    store.set(&format!("{prefix}/{rank}"), mine.as_bytes())?;
    if !store.check(&[&dkey])? {
        let keys: Vec<String> = (0..ws).map(|r| format!("{prefix}/{r}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let left = deadline.saturating_duration_since(Instant::now());
        let all_there = match store.wait(&refs, left) {
            Ok(()) => true,
            Err(StoreError::Timeout { .. }) => false,
            Err(e) => return Err(e),
        };
        let mut view = Vec::with_capacity(ws);
        for k in &refs {
            // Every key is there after a successful wait: one read each; else check first.
            view.push(if all_there || store.check(&[k])? { Some(String::from_utf8_lossy(&store.get(k)?).into_owned()) } else { None });
        }
        let proposal = serde_json::to_vec(&view).expect("a list of strings serialises");
        let stored = store.compare_set(&dkey, b"", &proposal)?;
        return decode(&stored, &dkey, store);
    }
    let stored = store.get(&dkey)?;
    decode(&stored, &dkey, store)
}

/// The self-test hazard `leader_decision`: rank 0 runs [`exchange`]; every other rank publishes
/// its value and waits for rank 0's decision up to `op_timeout` (the deadline ignored), then,
/// without one, goes on with a view of its own value alone.
pub(crate) fn exchange_led(
    store: &Store,
    prefix: &str,
    rank: usize,
    ws: usize,
    mine: &str,
    deadline: Instant,
    op_timeout: Duration,
) -> Result<Vec<Option<String>>, StoreError> {
    if rank == 0 {
        return exchange(store, prefix, rank, ws, mine, deadline);
    }
    let dkey = format!("{prefix}/decision");
    store.set(&format!("{prefix}/{rank}"), mine.as_bytes())?;
    match store.wait(&[&dkey], op_timeout) {
        Ok(()) => decode(&store.get(&dkey)?, &dkey, store),
        Err(StoreError::Timeout { .. }) => Ok((0..ws).map(|r| (r == rank).then(|| mine.to_string())).collect()),
        Err(e) => Err(e),
    }
}

fn decode(bytes: &[u8], key: &str, store: &Store) -> Result<Vec<Option<String>>, StoreError> {
    serde_json::from_slice(bytes)
        .map_err(|e| StoreError::Corrupt { path: store.location(), msg: format!("decision `{key}` is not a view: {e}") })
}

/// Agrees on one string (`<prefix>`): the first proposal stored wins.
pub(crate) fn agree(store: &Store, key: &str, mine: &str) -> Result<String, StoreError> {
    let stored = store.compare_set(key, b"", mine.as_bytes())?;
    Ok(String::from_utf8_lossy(&stored).into_owned())
}
