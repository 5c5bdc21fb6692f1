//! API STUB — to be implemented (c10d FileStore compatible). Signatures are fixed.
use std::path::Path;
use std::time::Duration;

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum StoreError {
    #[error("store timeout after {waited_ms} ms waiting for keys {keys:?} in {path}")]
    Timeout { keys: Vec<String>, waited_ms: u64, path: String },
    #[error("store I/O error on {path}: {msg}")]
    Io { path: String, msg: String },
    #[error("store file {path} is corrupt: {msg}")]
    Corrupt { path: String, msg: String },
}

pub struct FileStore {}

impl FileStore {
    /// Opens (creating if needed) the store at `path`, as one of `num_workers` users.
    pub fn open(_path: &Path, _num_workers: usize, _timeout: Duration) -> Result<FileStore, StoreError> { unimplemented!() }
    pub fn set(&self, _key: &str, _value: &[u8]) -> Result<(), StoreError> { unimplemented!() }
    /// Waits (up to the store timeout) for `key`, then returns its value.
    pub fn get(&self, _key: &str) -> Result<Vec<u8>, StoreError> { unimplemented!() }
    pub fn add(&self, _key: &str, _delta: i64) -> Result<i64, StoreError> { unimplemented!() }
    pub fn compare_set(&self, _key: &str, _expected: &[u8], _desired: &[u8]) -> Result<Vec<u8>, StoreError> { unimplemented!() }
    pub fn wait(&self, _keys: &[&str], _timeout: Duration) -> Result<(), StoreError> { unimplemented!() }
    pub fn check(&self, _keys: &[&str]) -> Result<bool, StoreError> { unimplemented!() }
    pub fn delete_key(&self, _key: &str) -> Result<bool, StoreError> { unimplemented!() }
    pub fn num_keys(&self) -> Result<i64, StoreError> { unimplemented!() }
    /// Barrier of `world_size` participants named `name` (reusable with new names).
    pub fn barrier(&self, _name: &str, _world_size: usize, _timeout: Duration) -> Result<(), StoreError> { unimplemented!() }
    pub fn timeout(&self) -> Duration { unimplemented!() }
    pub fn path(&self) -> &Path { unimplemented!() }
}
