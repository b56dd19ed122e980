//! Who stands for leader: the holders of [`CANDIDATES`] seats, keys
//! `seats/0`, `seats/1`, … bound to their holders' leases and taken by a
//! transaction while free. Deciding it from the member list (the lowest
//! ids stood) made every agent read the whole list, O(N²) bytes across a
//! cluster starting at once (`docs/coordination.md`, "At scale"); the
//! seats are three keys every agent follows by a watch.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tracing::info;

use super::{EtcdDiscovery, unavailable};
use crate::discovery::{
    DiscoveryError,
    prefix_watch::{Keys, Parse},
};

/// How many members stand for leader. Every member campaigning put N keys
/// under the election and N pending campaigns in etcd, and every election
/// watch saw each one: O(N²) events while a cluster of thousands starts.
/// Three keep a successor ready while a leader's lease runs out; a seat
/// whose holder's lease ends is free for the next member that looks.
pub const CANDIDATES: usize = 3;

/// A seat's value as written: `name@lease` (hex), so that a member finds
/// the seat it took even when etcd's answer to the taking was lost.
const HOLDER: Parse<String> = |_, value| std::str::from_utf8(value).ok().map(str::to_owned);

impl EtcdDiscovery {
    fn seats_prefix(&self) -> String {
        format!("{}seats/", self.prefix())
    }

    /// The seats' watch, current; a free seat taken if this member holds
    /// none.
    pub(super) async fn seats_current(&mut self) -> Result<(), DiscoveryError> {
        let prefix = self.seats_prefix();
        self.current(
            |d| &mut d.seat_watch,
            (Keys::Prefix(prefix.clone()), HOLDER),
            "seats",
        )
        .await?;
        let mine = self.seat_value();
        let held = |d: &Self, i: usize| -> Option<String> {
            let w = d.seat_watch.as_ref()?;
            w.get(format!("{prefix}{i}").as_bytes()).cloned()
        };
        // Taken by another (the watch may lag a seat just taken: absent
        // is not lost; a lapsed lease resets the seat at registering).
        if let Some(s) = self.seat
            && held(self, s).is_some_and(|v| Some(&v) != mine.as_ref())
        {
            self.seat = None;
        }
        if self.seat.is_some() {
            return Ok(());
        }
        // A seat taken under this lease whose answer was lost.
        if let Some(s) = (0..CANDIDATES).find(|&i| mine.is_some() && held(self, i) == mine) {
            self.seat = Some(s);
            return Ok(());
        }
        if let Some(seat) = (0..CANDIDATES).find(|&i| held(self, i).is_none()) {
            self.take_seat(seat).await?;
        }
        Ok(())
    }

    /// What this member writes in a seat it takes.
    fn seat_value(&self) -> Option<String> {
        Some(format!("{}@{:x}", self.me.as_ref()?, self.lease()?))
    }

    /// Takes `seat` if it is still free (another member may be quicker).
    async fn take_seat(&mut self, seat: usize) -> Result<(), DiscoveryError> {
        let (Some(value), Some(lease)) = (self.seat_value(), self.lease()) else {
            return Ok(()); // not registered yet
        };
        let key = format!("{}{seat}", self.seats_prefix());
        let if_free = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let taken = self.client.txn(if_free).await.map_err(unavailable)?;
        if taken.succeeded() {
            info!(node = ?self.me, seat, "standing for leader");
            self.seat = Some(seat);
        }
        Ok(())
    }

    /// Whether this member holds a seat: it campaigns, and follows the
    /// whole member list (it may have to lead).
    pub(super) fn is_candidate(&self) -> bool {
        self.seat.is_some()
    }
}
