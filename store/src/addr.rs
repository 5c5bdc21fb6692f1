//! Where a world's store lives, and one type over both kinds.
//!
//! A store address is written as a file path (`/tmp/concord-…/store`: a [`FileStore`]) or as
//! `tcp://HOST:PORT[/PREFIX]` (a [`TcpStore`] client of a c10d-compatible server, keys under
//! `PREFIX/`). `WorldInfo::store_path` carries this text, so backends open their world's store
//! with [`Store::open`] whatever its kind (core stays free of store types).

use crate::{FileStore, StoreError, TcpStore};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A parsed store address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreAddr {
    File(PathBuf),
    Tcp { host: String, port: u16, prefix: String },
}

const TCP_SCHEME: &str = "tcp://";

impl StoreAddr {
    /// Parses `tcp://HOST:PORT[/PREFIX]` (HOST may be `[v6]`) or takes the text as a file path.
    pub fn parse(text: &str) -> Result<StoreAddr, StoreError> {
        let Some(rest) = text.strip_prefix(TCP_SCHEME) else {
            return Ok(StoreAddr::File(PathBuf::from(text)));
        };
        let bad =
            |msg: &str| StoreError::Io { path: text.to_string(), msg: format!("not a store address (tcp://HOST:PORT[/PREFIX]): {msg}") };
        let (hostport, prefix) = match rest.split_once('/') {
            Some((hp, p)) => (hp, p.trim_matches('/').to_string()),
            None => (rest, String::new()),
        };
        let (host, port) = hostport.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let port: u16 = port.parse().map_err(|_| bad("the port is not a number from 0 to 65535"))?;
        Ok(StoreAddr::Tcp { host: host.to_string(), port, prefix })
    }

    /// Parses the text of a `WorldInfo::store_path`.
    pub fn from_path(p: &Path) -> Result<StoreAddr, StoreError> {
        StoreAddr::parse(&p.to_string_lossy())
    }

    /// The address as text, as `WorldInfo::store_path` carries it.
    pub fn to_path_buf(&self) -> PathBuf {
        PathBuf::from(self.to_string())
    }

    /// The same server with `sub` appended to the key prefix (a file store is returned as is:
    /// each world has its own file).
    pub fn with_prefix(&self, sub: &str) -> StoreAddr {
        match self {
            StoreAddr::File(_) => self.clone(),
            StoreAddr::Tcp { host, port, prefix } => {
                let sub = sub.trim_matches('/');
                let prefix = if prefix.is_empty() { sub.to_string() } else { format!("{prefix}/{sub}") };
                StoreAddr::Tcp { host: host.clone(), port: *port, prefix }
            }
        }
    }
}

impl std::fmt::Display for StoreAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreAddr::File(p) => write!(f, "{}", p.display()),
            StoreAddr::Tcp { host, port, prefix } => {
                let host = if host.contains(':') { format!("[{host}]") } else { host.clone() };
                if prefix.is_empty() {
                    write!(f, "{TCP_SCHEME}{host}:{port}")
                } else {
                    write!(f, "{TCP_SCHEME}{host}:{port}/{prefix}")
                }
            }
        }
    }
}

/// A world's store: a [`FileStore`] or a [`TcpStore`], with the same operations and deadlines.
pub enum Store {
    File(FileStore),
    Tcp(TcpStore),
}

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            Store::File($s) => $e,
            Store::Tcp($s) => $e,
        }
    };
}

impl Store {
    /// Opens the store at `addr` (the text of a [`StoreAddr`]) as one of `num_workers` users;
    /// `timeout` is the default deadline of `get` (and, for TCP, of connecting and every reply).
    pub fn open(addr: &Path, num_workers: usize, timeout: Duration) -> Result<Store, StoreError> {
        Store::open_addr(&StoreAddr::from_path(addr)?, num_workers, timeout)
    }

    pub fn open_addr(addr: &StoreAddr, num_workers: usize, timeout: Duration) -> Result<Store, StoreError> {
        match addr {
            StoreAddr::File(p) => FileStore::open(p, num_workers, timeout).map(Store::File),
            StoreAddr::Tcp { host, port, prefix } => TcpStore::connect(host, *port, prefix, timeout).map(Store::Tcp),
        }
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        both!(self, s => s.set(key, value))
    }
    /// Waits (up to the store timeout) for `key`, then returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        both!(self, s => s.get(key))
    }
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        both!(self, s => s.add(key, delta))
    }
    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        both!(self, s => s.compare_set(key, expected, desired))
    }
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        both!(self, s => s.wait(keys, timeout))
    }
    pub fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        both!(self, s => s.check(keys))
    }
    pub fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        both!(self, s => s.delete_key(key))
    }
    pub fn num_keys(&self) -> Result<i64, StoreError> {
        both!(self, s => s.num_keys())
    }
    pub fn barrier(&self, name: &str, world_size: usize, timeout: Duration) -> Result<(), StoreError> {
        both!(self, s => s.barrier(name, world_size, timeout))
    }
    pub fn timeout(&self) -> Duration {
        both!(self, s => s.timeout())
    }
    /// Where the store is, for messages (`/tmp/…/store` or `tcp://host:port`).
    pub fn location(&self) -> String {
        match self {
            Store::File(s) => s.path().display().to_string(),
            Store::Tcp(s) => format!("tcp://{}", s.addr()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print_back() {
        for text in ["/tmp/x/store", "tcp://127.0.0.1:29500", "tcp://node01:1234/run7/shm", "tcp://[::1]:80"] {
            assert_eq!(StoreAddr::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(StoreAddr::parse("tcp://h:1/a/").unwrap(), StoreAddr::Tcp { host: "h".into(), port: 1, prefix: "a".into() });
        assert_eq!(StoreAddr::parse("tcp://h:1").unwrap().with_prefix("w/0").to_string(), "tcp://h:1/w/0");
        assert_eq!(StoreAddr::parse("tcp://h:1/a").unwrap().with_prefix("b").to_string(), "tcp://h:1/a/b");
        for bad in ["tcp://h", "tcp://:1", "tcp://h:99999", "tcp://h:x"] {
            assert!(StoreAddr::parse(bad).is_err(), "{bad}");
        }
    }
}
