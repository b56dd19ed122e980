//! A prefix of etcd kept current on this agent by a watch: one read of the
//! prefix at the start (and after a lost watch), then only the changes.
//! Polling the member list and the election every refresh made each
//! refresh O(N) on every agent, O(N²) across the cluster: at 10,000
//! members, gigabytes a second out of etcd for lists that rarely change
//! (`docs/coordination.md`, "At scale").

use std::collections::BTreeMap;

use etcd_client::{Client, EventType, GetOptions, WatchOptions, WatchStream};
use tokio::{sync::mpsc, task::JoinHandle};
use tracing::warn;

/// One key's value, parsed, and when it was created (etcd's create
/// revision: the election's order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry<T> {
    pub create_revision: i64,
    pub value: T,
}

/// Reads a key's value (`key`, `value`); `None` leaves the key out.
pub(super) type Parse<T> = fn(&[u8], &[u8]) -> Option<T>;

/// What a watch follows: every key under a prefix, or one key (a member's
/// handed-out place: `places/node-1` as a prefix would take `node-10`'s).
#[derive(Clone, Debug)]
pub(super) enum Keys {
    Prefix(String),
    Exact(String),
}

impl Keys {
    fn key(&self) -> &str {
        match self {
            Keys::Prefix(k) | Keys::Exact(k) => k,
        }
    }

    fn get_options(&self) -> Option<GetOptions> {
        matches!(self, Keys::Prefix(_)).then(|| GetOptions::new().with_prefix())
    }

    fn watch_options(&self) -> WatchOptions {
        match self {
            Keys::Prefix(_) => WatchOptions::new().with_prefix(),
            Keys::Exact(_) => WatchOptions::new(),
        }
    }
}

/// The prefix's keys with their values parsed once, as they arrive (not at
/// every refresh: at 10,000 members that was 10,000 records read again
/// every 2 s, twice).
pub(super) struct PrefixWatch<T> {
    entries: BTreeMap<Vec<u8>, Entry<T>>,
    parse: Parse<T>,
    changes: mpsc::UnboundedReceiver<Change>,
    task: JoinHandle<()>,
}

/// What the watch task saw.
enum Change {
    Put {
        key: Vec<u8>,
        entry: Entry<Vec<u8>>,
    },
    Delete {
        key: Vec<u8>,
    },
    /// The watch ended (etcd restarted, the connection broke, the start
    /// revision was compacted): the prefix must be read again.
    Lost(String),
}

impl<T> PrefixWatch<T> {
    /// Reads `keys` whole through `client` and watches them from the next
    /// revision through `streaming` (a connection without a request
    /// timeout: a stream outlives any timeout); each value read by `parse`.
    pub(super) async fn start(
        client: &mut Client,
        streaming: &mut Client,
        keys: Keys,
        parse: Parse<T>,
    ) -> Result<Self, etcd_client::Error> {
        let resp = client.get(keys.key(), keys.get_options()).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let entries = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let entry = Entry {
                    create_revision: kv.create_revision(),
                    value: parse(kv.key(), kv.value())?,
                };
                Some((kv.key().to_vec(), entry))
            })
            .collect();
        let options = keys.watch_options().with_start_revision(revision + 1);
        let stream = streaming.watch(keys.key(), Some(options)).await?;
        let (tx, changes) = mpsc::unbounded_channel();
        Ok(PrefixWatch {
            entries,
            parse,
            changes,
            task: tokio::spawn(forward_changes(stream, tx)),
        })
    }

    /// Applies the changes seen since the last call; `false` once the
    /// watch is lost (`what` names the prefix in the warning).
    pub(super) fn catch_up(&mut self, what: &str) -> bool {
        loop {
            match self.changes.try_recv() {
                Ok(Change::Put { key, entry }) => match (self.parse)(&key, &entry.value) {
                    Some(value) => {
                        let create_revision = entry.create_revision;
                        self.entries.insert(
                            key,
                            Entry {
                                create_revision,
                                value,
                            },
                        );
                    }
                    None => {
                        self.entries.remove(&key);
                    }
                },
                Ok(Change::Delete { key }) => {
                    self.entries.remove(&key);
                }
                Ok(Change::Lost(why)) => {
                    warn!("etcd watch of the {what} lost ({why}); reading it again");
                    return false;
                }
                Err(mpsc::error::TryRecvError::Empty) => return true,
                Err(mpsc::error::TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// The parsed values, by key.
    pub(super) fn values(&self) -> impl Iterator<Item = &T> {
        self.entries.values().map(|e| &e.value)
    }

    /// The value under `key`, if any.
    pub(super) fn get(&self, key: &[u8]) -> Option<&T> {
        self.entries.get(key).map(|e| &e.value)
    }

    /// The value of the oldest key (etcd's election: the leader's).
    pub(super) fn oldest(&self) -> Option<&T> {
        self.entries
            .values()
            .min_by_key(|e| e.create_revision)
            .map(|e| &e.value)
    }
}

impl<T> Drop for PrefixWatch<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards the watch's events until it ends.
async fn forward_changes(mut stream: WatchStream, changes: mpsc::UnboundedSender<Change>) {
    let why = loop {
        let resp = match stream.message().await {
            Ok(Some(resp)) => resp,
            Ok(None) => break "the stream ended".to_owned(),
            Err(e) => break e.to_string(),
        };
        if resp.canceled() || resp.compact_revision() > 0 {
            break format!("cancelled: {}", resp.cancel_reason());
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let key = kv.key().to_vec();
            let change = match ev.event_type() {
                EventType::Put => Change::Put {
                    key,
                    entry: Entry {
                        create_revision: kv.create_revision(),
                        value: kv.value().to_vec(),
                    },
                },
                EventType::Delete => Change::Delete { key },
            };
            if changes.send(change).is_err() {
                return; // the watch's owner is gone
            }
        }
    };
    let _ = changes.send(Change::Lost(why));
}
