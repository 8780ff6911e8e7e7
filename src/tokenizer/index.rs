//! Token ids by text, without a second copy of the texts: an open-addressing table of ids
//! whose keys are the vocabulary's own texts. A map keyed by cloned strings doubled the
//! vocabulary in RAM (~2.5 MB for 49k tokens).
//!
//! The hash is keyed per process (`RandomState`, SipHash): a vocabulary crafted to collide
//! cannot turn loading into quadratic work.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

const EMPTY: u32 = u32::MAX;

pub(crate) struct TextIndex {
    /// Token ids, `EMPTY` for free slots; at most half full, so probes stay short.
    slots: Box<[u32]>,
    hasher: RandomState,
}

impl TextIndex {
    /// Indexes `texts` (id = position). A repeated text returns `Err((first, second))`.
    pub fn build(texts: &[Box<[u8]>]) -> Result<TextIndex, (u32, u32)> {
        let cap = (texts.len() * 2).next_power_of_two().max(8);
        let mut idx = TextIndex {
            slots: vec![EMPTY; cap].into_boxed_slice(),
            hasher: RandomState::new(),
        };
        for (id, t) in texts.iter().enumerate() {
            match idx.probe(texts, t) {
                Ok(first) => return Err((first, id as u32)),
                Err(slot) => idx.slots[slot] = id as u32,
            }
        }
        Ok(idx)
    }

    /// The id of `text`, given the same `texts` the index was built from.
    pub fn get(&self, texts: &[Box<[u8]>], text: &[u8]) -> Option<u32> {
        self.probe(texts, text).ok()
    }

    /// `Ok(id)` where `text` is, or `Err(slot)`: the free slot where it would go.
    fn probe(&self, texts: &[Box<[u8]>], text: &[u8]) -> Result<u32, usize> {
        let mask = self.slots.len() - 1;
        let mut i = self.hasher.hash_one(text) as usize & mask;
        loop {
            match self.slots[i] {
                EMPTY => return Err(i),
                id if *texts[id as usize] == *text => return Ok(id),
                _ => i = (i + 1) & mask,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TextIndex;

    fn texts(v: &[&str]) -> Vec<Box<[u8]>> {
        v.iter().map(|s| s.as_bytes().into()).collect()
    }

    #[test]
    fn every_text_finds_its_id_and_others_find_nothing() {
        let t: Vec<Box<[u8]>> = (0..5000)
            .map(|i| format!("tok{i}").into_bytes().into())
            .collect();
        let idx = TextIndex::build(&t).unwrap();
        for (i, s) in t.iter().enumerate() {
            assert_eq!(idx.get(&t, s), Some(i as u32));
        }
        for s in ["", "tok", "tok5000", "x"] {
            assert_eq!(idx.get(&t, s.as_bytes()), None, "{s}");
        }
    }

    #[test]
    fn a_repeated_text_names_both_ids() {
        let t = texts(&["a", "b", "c", "b"]);
        assert_eq!(TextIndex::build(&t).err(), Some((1, 3)));
        let empty = TextIndex::build(&[]).unwrap();
        assert_eq!(empty.get(&[], b"a"), None);
    }
}
