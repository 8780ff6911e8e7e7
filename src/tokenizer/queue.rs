//! The merge queue shared by both BPE flavours: candidate pairs bucketed by priority rank.
//!
//! Pairs must merge best rank first, leftmost first. A binary heap of every pair works but
//! pays a cache miss per level on each of millions of pops for a 1 MiB word; here each rank
//! has a bucket (a linked list of left positions) and a min-heap holds only the ranks that
//! have one. A whole bucket is taken and sorted at once. Pairs created by a merge normally rank
//! after it (a token exists only once the merge that makes it has happened); when a vocabulary
//! says otherwise, the caller puts the rest of the bucket back and picks again, so the order
//! stays exact.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// "No index" in the queue and in the callers' symbol lists.
pub(crate) const NONE: u32 = u32::MAX;

/// Candidate pairs by rank (lower is better).
#[derive(Default)]
pub(crate) struct RankQueue {
    /// Per rank, the newest entry of its bucket, `NONE` when empty (all empty between words).
    heads: Vec<u32>,
    /// `(left position, next entry)`.
    entries: Vec<(u32, u32)>,
    ranks: BinaryHeap<Reverse<u32>>,
}

impl RankQueue {
    pub fn reset(&mut self, n_ranks: usize) {
        if self.heads.len() < n_ranks {
            self.heads.resize(n_ranks, NONE);
        }
        self.entries.clear();
        self.ranks.clear();
    }

    pub fn push(&mut self, rank: u32, left: u32) {
        let head = &mut self.heads[rank as usize];
        if *head == NONE {
            self.ranks.push(Reverse(rank));
        }
        self.entries.push((left, *head));
        *head = (self.entries.len() - 1) as u32;
    }

    /// Empties the lowest-rank bucket into `out`, positions ascending; returns its rank.
    pub fn pop_bucket(&mut self, out: &mut Vec<u32>) -> Option<u32> {
        let Reverse(rank) = self.ranks.pop()?;
        let mut e = std::mem::replace(&mut self.heads[rank as usize], NONE);
        out.clear();
        while e != NONE {
            let (left, next) = self.entries[e as usize];
            out.push(left);
            e = next;
        }
        out.sort_unstable();
        out.dedup();
        Some(rank)
    }
}
