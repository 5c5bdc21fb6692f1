//! The one agreement primitive: publish, read every rank's with the deadline, decide by
//! `compare_set` (first writer wins; everyone adopts the stored value).

use concord_store::{Store, StoreError};
use std::time::Instant;

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

fn decode(bytes: &[u8], key: &str, store: &Store) -> Result<Vec<Option<String>>, StoreError> {
    serde_json::from_slice(bytes)
        .map_err(|e| StoreError::Corrupt { path: store.location(), msg: format!("decision `{key}` is not a view: {e}") })
}

/// Agrees on one string (`<prefix>`): the first proposal stored wins.
pub(crate) fn agree(store: &Store, key: &str, mine: &str) -> Result<String, StoreError> {
    let stored = store.compare_set(key, b"", mine.as_bytes())?;
    Ok(String::from_utf8_lossy(&stored).into_owned())
}
