//! The decision cache: winners keyed by (backend, op, dtype, shape, reduce op, group ranks,
//! choice-set hash, policy), one JSON file per rank, reused by a later process. The policy is in
//! the key because the winner is a function of it: a choice fastest on average may be the
//! slowest on the slowest rank (review11 found the key without it). A hit is only used when
//! every rank hit with the same winner (agreed in the pre-sync); otherwise every rank re-tunes.
//! Only a measured winner is cached: a declared default taken because every choice was inf (a
//! fault that may be transient) is not.

use crate::{OpInstance, Policy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub winner: String,
    pub policy: String,
    pub reduced_ns: Option<u64>,
}

/// The file's contents.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Cache {
    pub version: u32,
    pub entries: BTreeMap<String, Entry>,
}

/// The file format's version: 2 since the policy joined the key (a version-1 file's entries
/// simply never match, which costs a re-tune, never a wrong winner).
pub const VERSION: u32 = 2;

/// The key of one decision.
pub fn key(backend: &str, inst: &OpInstance, group_ranks: &[usize], choice_hash: &str, policy: Policy) -> String {
    format!("{backend}|{}|{group_ranks:?}|{choice_hash}|{}", inst.key(), policy.name())
}

impl Cache {
    /// Reads `path` (absent or unreadable: empty, never an error — a bad file only costs a re-tune).
    pub fn load(path: &Path) -> Cache {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Cache { version: VERSION, entries: BTreeMap::new() })
    }
    /// Writes atomically (temp file + rename).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = PathBuf::from(format!("{}.tmp{}", path.display(), std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        std::fs::rename(&tmp, path)
    }
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }
    pub fn put(&mut self, key: String, e: Entry) {
        self.version = VERSION;
        self.entries.insert(key, e);
    }
}
