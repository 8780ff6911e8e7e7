//! Acknowledgements in the order their messages arrived. MQTT requires a client to send
//! PUBACKs in the order it received the QoS 1 PUBLISHes (MQTT-4.6.0-2, both 3.1.1 and 5), and
//! a request is acknowledged only once its answer is published, long after a cancel that came
//! behind it is done with. Acking that cancel at once broke the rule: Mosquitto lets it pass,
//! the embedded broker (rumqttd) closes the connection, delivers both again, and the client
//! saw its final answer twice. Each message takes a slot when it arrives; an ack that is ready
//! waits for every slot before it. Pure: [`super::core`] acknowledges what [`AckOrder::ready`]
//! returns.

use std::collections::VecDeque;

/// A message's place among the acknowledgements of one broker session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    session: u64,
    n: u64,
}

/// The acknowledgements still owed, oldest first.
#[derive(Debug)]
pub struct AckOrder<A> {
    session: u64,
    /// The slot number of `owed[0]`.
    first: u64,
    owed: VecDeque<Owed<A>>,
}

#[derive(Debug)]
enum Owed<A> {
    /// Its message is still being answered.
    Waiting,
    /// Ready, behind an older one.
    Ready(A),
}

impl<A> Default for AckOrder<A> {
    fn default() -> Self {
        AckOrder {
            session: 0,
            first: 0,
            owed: VecDeque::new(),
        }
    }
}

impl<A> AckOrder<A> {
    /// A message arrived in broker session `session` (the client's count of sessions the broker
    /// forgot): its slot. A new session voids every ack still owed: the broker will not take
    /// them, and their packet ids may be reused.
    pub fn arrive(&mut self, session: u64) -> Slot {
        if session != self.session {
            self.session = session;
            self.first += self.owed.len() as u64;
            self.owed.clear();
        }
        self.owed.push_back(Owed::Waiting);
        Slot {
            session,
            n: self.first + self.owed.len() as u64 - 1,
        }
    }

    /// `slot`'s acknowledgement is `ack`: every acknowledgement that may be sent now, in order
    /// (none while an older one is outstanding). An ack of a forgotten session is dropped.
    pub fn ready(&mut self, slot: Slot, ack: A) -> Vec<A> {
        if let Some(i) = self.index(slot) {
            self.owed[i] = Owed::Ready(ack);
        }
        self.drain()
    }

    /// Acknowledgements owed, ready or not.
    #[cfg(test)]
    fn owed(&self) -> usize {
        self.owed.len()
    }

    fn index(&self, slot: Slot) -> Option<usize> {
        if slot.session != self.session || slot.n < self.first {
            return None;
        }
        let i = usize::try_from(slot.n - self.first).ok()?;
        matches!(self.owed.get(i), Some(Owed::Waiting)).then_some(i)
    }

    fn drain(&mut self) -> Vec<A> {
        let mut out = Vec::new();
        while let Some(Owed::Ready(_)) = self.owed.front() {
            if let Some(Owed::Ready(a)) = self.owed.pop_front() {
                out.push(a);
            }
            self.first += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_ack_waits_for_an_earlier_one_then_both_go_in_order() {
        let mut o = AckOrder::default();
        let request = o.arrive(0);
        let cancel = o.arrive(0);
        assert_eq!(o.ready(cancel, "cancel"), Vec::<&str>::new());
        assert_eq!(o.ready(request, "request"), vec!["request", "cancel"]);
        assert_eq!(o.owed(), 0);
    }

    #[test]
    fn acks_ready_in_order_go_at_once() {
        let mut o = AckOrder::default();
        let a = o.arrive(0);
        let b = o.arrive(0);
        assert_eq!(o.ready(a, 1), vec![1]);
        assert_eq!(o.ready(b, 2), vec![2]);
    }

    #[test]
    fn a_gap_in_the_middle_holds_back_only_what_follows_it() {
        let mut o = AckOrder::default();
        let s: Vec<Slot> = (0..4).map(|_| o.arrive(0)).collect();
        assert_eq!(o.ready(s[0], 0), vec![0]);
        assert_eq!(o.ready(s[2], 2), Vec::<i32>::new());
        assert_eq!(o.ready(s[3], 3), Vec::<i32>::new());
        assert_eq!(o.ready(s[1], 1), vec![1, 2, 3]);
    }

    #[test]
    fn a_new_broker_session_drops_what_the_old_one_owed() {
        let mut o = AckOrder::default();
        let old = o.arrive(0);
        let _never = o.arrive(0);
        let new = o.arrive(1);
        assert_eq!(o.owed(), 1);
        // The old session's ack is void; the new one is not held back by it.
        assert_eq!(o.ready(old, "old"), Vec::<&str>::new());
        assert_eq!(o.ready(new, "new"), vec!["new"]);
    }

    #[test]
    fn a_slot_is_acknowledged_once() {
        let mut o = AckOrder::default();
        let a = o.arrive(0);
        let b = o.arrive(0);
        assert_eq!(o.ready(b, 2), Vec::<u8>::new());
        assert_eq!(
            o.ready(b, 9),
            Vec::<u8>::new(),
            "a second ack of b changes nothing"
        );
        assert_eq!(o.ready(a, 1), vec![1, 2]);
        assert_eq!(o.ready(a, 5), Vec::<u8>::new(), "a is gone");
    }
}
