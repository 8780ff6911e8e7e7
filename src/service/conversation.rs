//! A named session's conversation, as the worker keeps it: the request's messages read
//! against the session's log (`engine::store::conversation`), the rendered prompt slid to fit
//! the context, and the finished turn written back before the answer is acknowledged.
//!
//! A request naming a session with one user message continues the conversation: the message
//! is appended to the logged ones and the whole conversation is rendered with the chat
//! template, so the cached positions of the earlier turns are reused (the rendering of turns
//! 1..n is the beginning of the rendering of turns 1..n+1). A request that brings several
//! messages (or says it replaces) makes them the conversation. A turn is logged only when its
//! answer ends by itself or at its length (`eog`, `length`); a cancelled, timed-out or failed
//! turn is not kept, and the conversation is as before it.

use super::prompt::{self, Built};
use super::{ErrorCode, Prompt, Request, ServiceError};
use crate::engine::FinishReason;
use crate::engine::store::SessionId;
use crate::engine::store::conversation::{ConversationFile, Record};
use crate::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use std::path::Path;

/// What to do when a session's conversation no longer fits the context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContextFull {
    /// Drop the oldest turns (the system prompt stays) until it fits, and say how many.
    #[default]
    Slide,
    /// Refuse the request (`context_full`): the client resets the session or starts another.
    Refuse,
}

/// How much of a conversation a session keeps (`state.conversation_turns`,
/// `state.conversation_bytes`): past either, its oldest turns leave its log as new ones come,
/// so the log stays small whatever a client does (the context holds far fewer anyway).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConversationBounds {
    pub turns: usize,
    /// Bytes of the messages' text (the system prompt aside).
    pub bytes: usize,
}

impl Default for ConversationBounds {
    fn default() -> Self {
        ConversationBounds {
            turns: 128,
            bytes: 64 << 10,
        }
    }
}

impl ConversationBounds {
    /// Of `messages` with `adding` more bytes in one more turn, how many of the oldest to drop
    /// (whole turns) so that what is left is within the bounds.
    fn excess(self, messages: &[ChatMessage], adding: usize) -> usize {
        let max_messages = 2 * self.turns.max(1);
        let mut bytes: usize = messages.iter().map(|m| m.content.len()).sum::<usize>() + adding;
        let mut drop = (messages.len() + 2).saturating_sub(max_messages);
        drop = drop.next_multiple_of(2).min(messages.len());
        bytes -= messages[..drop]
            .iter()
            .map(|m| m.content.len())
            .sum::<usize>();
        while bytes > self.bytes && drop < messages.len() {
            let n = 2.min(messages.len() - drop);
            bytes -= messages[drop..drop + n]
                .iter()
                .map(|m| m.content.len())
                .sum::<usize>();
            drop += n;
        }
        drop
    }
}

/// One request's turn in a named session's conversation.
pub(super) struct Turn {
    log: Option<ConversationFile>,
    /// The user message this turn adds (continuing), or `None` (the request replaced).
    user: Option<String>,
    /// The conversation rendered for this turn, after sliding.
    system: Option<String>,
    messages: Vec<ChatMessage>,
    /// Messages of the log dropped to fit the context.
    dropped_messages: usize,
}

impl Turn {
    /// Reads the session's log at `path` and builds the request's prompt from it. A log that
    /// cannot be read or written (read-only or failing flash) costs the memory, never the
    /// answer: the request is then answered from its own messages and the reason logged.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn begin(
        path: &Path,
        id: &SessionId,
        req: &Request,
        tok: &Tokenizer,
        template: Option<&ChatTemplate>,
        n_ctx: usize,
        max_bytes: usize,
        policy: ContextFull,
    ) -> Result<(Turn, Built), ServiceError> {
        let log = match ConversationFile::open(path) {
            Ok((log, opened)) => {
                if let Some(t) = opened.cut {
                    tracing::warn!(session = %id, "conversation log: {t:?} tail cut at open");
                }
                if let Some(bad) = opened.set_aside {
                    tracing::warn!(session = %id, "conversation log was unreadable: moved to {}", bad.display());
                }
                Some(log)
            }
            Err(e) => {
                tracing::error!(session = %id, "conversation not kept: {e}");
                None
            }
        };
        let logged = log.as_ref().map(|l| l.conversation().clone());
        let (user, system, mut messages) = match (&req.prompt, req.replace) {
            (Prompt::Chat(m), false) if m.len() == 1 && m[0].role == "user" => {
                let mut all = logged
                    .as_ref()
                    .map_or_else(Vec::new, |c| c.messages.clone());
                all.push(m[0].clone());
                let system = req
                    .system
                    .clone()
                    .or_else(|| logged.as_ref().and_then(|c| c.system.clone()));
                (Some(m[0].content.clone()), system, all)
            }
            (Prompt::Chat(m), _) => (None, req.system.clone(), m.clone()),
            _ => {
                return Err(ServiceError::new(
                    ErrorCode::BadRequest,
                    "a named session's conversation needs a chat message, not a raw prompt",
                ));
            }
        };
        // Room for the answer, as truncation keeps it: max_tokens, at most half the context.
        let room = req.max_tokens.min(n_ctx / 2).max(1);
        let mut dropped = 0;
        let built = loop {
            let mut r = req.clone();
            r.prompt = Prompt::Chat(messages.clone());
            r.system = system.clone();
            if messages.len() <= 1 {
                // Only the request's own message is left: it is held to what any request is
                // (refused past the context, or truncated if it asks to be).
                break prompt::build(tok, template, &r, n_ctx, max_bytes)?;
            }
            r.truncate = false;
            let fits = match prompt::build(tok, template, &r, n_ctx, max_bytes) {
                Ok(b) if b.ids.len() + room <= n_ctx => Ok(b),
                Ok(b) => Err((b.ids.len(), None)),
                Err(e) if e.code == ErrorCode::ContextFull => Err((n_ctx, Some(e))),
                Err(e) => return Err(e),
            };
            match fits {
                Ok(b) => break b,
                Err((len, e)) if policy == ContextFull::Refuse => {
                    return Err(e.unwrap_or_else(|| {
                        ServiceError::new(
                            ErrorCode::ContextFull,
                            format!(
                                "the conversation is {len} tokens and the answer needs room for \
                                 {room} more, but the context holds {n_ctx}: reset the session \
                                 or start another"
                            ),
                        )
                    }));
                }
                Err(_) => {
                    // A turn is a user message and its answer; never the latest message.
                    let n = 2.min(messages.len() - 1);
                    messages.drain(..n);
                    dropped += n;
                }
            }
        };
        Ok((
            Turn {
                log,
                user,
                system,
                messages,
                dropped_messages: dropped,
            },
            built,
        ))
    }

    /// Turns of the conversation dropped to fit the context.
    pub(super) fn dropped_turns(&self) -> usize {
        self.dropped_messages.div_ceil(2)
    }

    /// Logs the finished turn (synced before it returns: the answer is acknowledged after).
    /// Returns the turn number logged, or `None` when the turn is not kept.
    pub(super) fn finish(
        mut self,
        id: &SessionId,
        answer: &str,
        finish: FinishReason,
        bounds: ConversationBounds,
    ) -> Option<u64> {
        if !matches!(finish, FinishReason::Eog | FinishReason::Length) {
            tracing::info!(session = %id, ?finish, "turn not kept in the conversation");
            return None;
        }
        let log = self.log.as_mut()?;
        let prior = log.conversation().turns;
        let mut records = Vec::new();
        match self.user.take() {
            Some(user) => {
                // Drops count the log's messages only (the new one is never dropped), and the
                // oldest past the bound go too.
                let c = log.conversation();
                let kept = &c.messages[self.dropped_messages.min(c.messages.len())..];
                let over = bounds.excess(kept, user.len() + answer.len());
                let drop = (self.dropped_messages + over).min(c.messages.len());
                if self.system != c.system {
                    // A system prompt given with this turn is the conversation's from now on.
                    records.push(Record::Replace {
                        system: self.system.take(),
                        messages: c.messages[drop..].to_vec(),
                        turns: prior,
                    });
                } else if drop > 0 {
                    records.push(Record::Drop(drop as u32));
                }
                records.push(Record::Turn {
                    user,
                    answer: answer.to_owned(),
                });
            }
            None => {
                let mut messages = std::mem::take(&mut self.messages);
                let last_user = messages.last().is_some_and(|m| m.role == "user");
                let user = if last_user { messages.pop() } else { None };
                let adding = user.as_ref().map_or(0, |u| u.content.len()) + answer.len();
                messages.drain(..bounds.excess(&messages, adding));
                let (turns, user) = match user {
                    Some(u) => (prior, Some(u.content)),
                    None => {
                        messages.push(ChatMessage::new("assistant", answer));
                        (prior + 1, None)
                    }
                };
                records.push(Record::Replace {
                    system: self.system.take(),
                    messages,
                    turns,
                });
                if let Some(user) = user {
                    records.push(Record::Turn {
                        user,
                        answer: answer.to_owned(),
                    });
                }
            }
        }
        for r in records {
            if let Err(e) = log.append(r) {
                tracing::error!(session = %id, "turn not kept in the conversation: {e}");
                return None;
            }
        }
        // Rewritten as one record when the log holds much more than the conversation.
        let compact_at = (4 * bounds.bytes as u64).max(64 << 10);
        if log.len() > compact_at
            && let Err(e) = log.compact()
        {
            tracing::warn!(session = %id, "conversation log not compacted: {e}");
        }
        Some(log.conversation().turns)
    }
}

/// The conversation logged at `path` as text ([`Conversation::transcript`]); empty when there
/// is none. Reading never changes the log.
///
/// [`Conversation::transcript`]: crate::engine::store::conversation::Conversation::transcript
pub fn transcript(path: &Path) -> Result<String, crate::engine::store::StoreError> {
    Ok(crate::engine::store::conversation::read(path)?
        .map(|c| c.transcript())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::ConversationBounds;
    use crate::tokenizer::ChatMessage;

    fn turns(n: usize, bytes_each: usize) -> Vec<ChatMessage> {
        (0..2 * n)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                ChatMessage::new(role, "x".repeat(bytes_each))
            })
            .collect()
    }

    #[test]
    fn the_oldest_whole_turns_go_past_either_bound() {
        let b = |turns, bytes| ConversationBounds { turns, bytes };
        // Within both: nothing goes.
        assert_eq!(b(4, 1000).excess(&turns(3, 10), 20), 0);
        // A fourth turn fits 4 turns; a fifth pushes the oldest out.
        assert_eq!(b(4, 1000).excess(&turns(4, 10), 20), 2);
        assert_eq!(b(1, 1000).excess(&turns(3, 10), 20), 6);
        // 3 turns of 2 × 100 bytes and 200 more: 800 > 500, so two turns go (400 left).
        assert_eq!(b(128, 500).excess(&turns(3, 100), 200), 4);
        // A new turn larger than the bound alone empties the log, never more.
        assert_eq!(b(128, 100).excess(&turns(3, 10), 1000), 6);
        assert_eq!(b(128, 100).excess(&[], 1000), 0);
    }
}
