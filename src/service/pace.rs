//! How much of a prompt goes between two decode steps of a batch.
//!
//! A prompt that arrives while other answers stream is fed in pieces between their decode
//! steps. Each piece delays their next token by its own time, so a piece is sized from what
//! the batch measures as it runs: a piece takes about [`Pace::SHARE`] of a decode step, and
//! the answers already streaming see their tokens come about that much slower (about 1.5× as
//! far apart, where a whole chunk deep in a long prompt can take many steps' time). The
//! prompt's own answer starts later for it. With no answer decoding the prompt goes in whole
//! chunks: nobody waits on it.
//!
//! The piece size changes nothing in the answer: a prompt fed in pieces of any size computes
//! the bits it computes in one go (the engine's tests hold it to that).

use std::time::Duration;

/// Moving averages of a decode step's time and of a prompt token's time in the batch.
#[derive(Debug, Default)]
pub(super) struct Pace {
    /// Seconds of a decode step (its forward pass and the sampling of every answer in it).
    step_s: Option<f64>,
    /// Seconds per token of a prompt piece fed between steps.
    token_s: Option<f64>,
}

impl Pace {
    /// The share of a decode step a prompt piece may take while answers stream.
    const SHARE: f64 = 0.5;
    /// Weight of the newest measure in the moving averages: a few steps follow a change (a
    /// wider batch, a longer context, a busy core).
    const NEW: f64 = 0.25;

    /// Tokens of a prompt to feed before the next decode step, at most `chunk`; `streaming`:
    /// whether other answers wait on the step. The first piece, before anything is measured,
    /// is a chunk: it measures what the next ones take.
    pub(super) fn piece(&self, chunk: usize, streaming: bool) -> usize {
        if !streaming {
            return chunk;
        }
        match (self.step_s, self.token_s) {
            (Some(step), Some(token)) if token > 0.0 => {
                // Clamped before the cast; a step or token time is never NaN (`token > 0.0`).
                (Self::SHARE * step / token).clamp(1.0, chunk as f64) as usize
            }
            _ => chunk,
        }
    }

    /// A decode step took `took`.
    pub(super) fn stepped(&mut self, took: Duration) {
        Self::update(&mut self.step_s, took.as_secs_f64());
    }

    /// A prompt piece of `tokens` took `took`. The caller leaves out a prompt's last piece: it
    /// also computes the output layer, which would make the next pieces smaller than they need
    /// be.
    pub(super) fn fed(&mut self, tokens: usize, took: Duration) {
        if tokens > 0 {
            Self::update(&mut self.token_s, took.as_secs_f64() / tokens as f64);
        }
    }

    fn update(avg: &mut Option<f64>, x: f64) {
        *avg = Some(match *avg {
            Some(a) => a + Self::NEW * (x - a),
            None => x,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1000.0)
    }

    #[test]
    fn a_piece_takes_a_share_of_a_step_within_one_token_and_a_chunk() {
        let mut p = Pace::default();
        // Nothing measured yet: a chunk.
        assert_eq!(p.piece(64, true), 64);
        assert_eq!(p.piece(64, false), 64);
        p.stepped(ms(8.0));
        assert_eq!(p.piece(64, true), 64);
        p.fed(2, ms(2.0));
        // 0.5 × 8 ms / 1 ms a token.
        assert_eq!(p.piece(64, true), 4);
        assert_eq!(p.piece(3, true), 3);
        assert_eq!(p.piece(64, false), 64);
        // Slow prompt tokens: never less than one.
        let mut slow = Pace::default();
        slow.stepped(ms(1.0));
        slow.fed(1, ms(50.0));
        assert_eq!(slow.piece(64, true), 1);
        // Fast ones: never more than the chunk.
        let mut fast = Pace::default();
        fast.stepped(ms(100.0));
        fast.fed(10, ms(1.0));
        assert_eq!(fast.piece(64, true), 64);
        // An empty piece measures nothing.
        fast.fed(0, ms(1.0));
        assert_eq!(fast.piece(64, true), 64);
    }

    #[test]
    fn the_averages_follow_a_change_within_a_few_steps() {
        let mut p = Pace::default();
        p.stepped(ms(8.0));
        p.fed(4, ms(4.0));
        assert_eq!(p.piece(64, true), 4);
        // The steps become three times longer (a wider batch): the pieces grow with them.
        for _ in 0..12 {
            p.stepped(ms(24.0));
        }
        assert_eq!(p.piece(64, true), 11);
        // One slow outlier moves the average, not all the way.
        p.fed(1, ms(20.0));
        assert!(
            (2..11).contains(&p.piece(64, true)),
            "{}",
            p.piece(64, true)
        );
    }
}
