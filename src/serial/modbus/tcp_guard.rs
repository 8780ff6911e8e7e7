//! Modbus TCP requests too long for the protocol, answered before tokio-modbus sees them.
//!
//! A PDU is at most 253 bytes (an ADU of 260), so FC16 writes at most 123 registers. A master
//! that writes 124 sends a 254-byte PDU: tokio-modbus cannot decode it, drops the connection
//! and answers nothing, and the master cannot tell why. [`Guard`] follows the MBAP frames of a
//! connection as they arrive, passes every frame the protocol allows through unchanged, and
//! answers a longer one itself with the exception the map gives for a quantity out of range,
//! 0x03 (illegal data value; 0x01 for a function the map does not serve, 0x0B for another unit
//! id, as the server answers them), then skips its bytes: the connection goes on. [`Guarded`]
//! is the thin adapter that puts a guard between the socket and tokio-modbus.

use crate::serial::stats::{Count, PortStats};
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Longest PDU the protocol allows (function code included).
pub const MAX_PDU: usize = 253;
/// The MBAP header: transaction id, protocol id, length, unit id.
const MBAP: usize = 7;

/// Whether a Modbus TCP server for `unit` serves a request to `slave`: its own unit id and
/// 0xFF, the "unit not used" value of the Modbus TCP guide.
pub fn tcp_unit_served(unit: u8, slave: u8) -> bool {
    slave == unit || slave == 0xFF
}

/// Where in the stream of a connection the guard is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// Reading a header: `have` bytes of it so far.
    Header,
    /// The header held a PDU too long: its function code comes next.
    Function,
    /// Inside a frame that goes through: this many bytes of it left.
    Pass(usize),
    /// Inside a refused frame: this many bytes of it left to drop.
    Skip(usize),
    /// A header tokio-modbus will refuse anyway (another protocol id, no PDU): everything
    /// goes through from here, and tokio-modbus ends the connection.
    Through,
}

/// Follows the frames of one connection: fed the bytes read from the master, it says which go
/// on to the Modbus server and what the master is answered at once. No I/O.
#[derive(Debug)]
pub struct Guard {
    unit: u8,
    at: At,
    header: [u8; MBAP],
    have: usize,
}

impl Guard {
    /// A guard for a server of unit id `unit`.
    pub fn new(unit: u8) -> Guard {
        Guard {
            unit,
            at: At::Header,
            header: [0; MBAP],
            have: 0,
        }
    }

    /// Feeds `bytes` read from the master: appends to `pass` what goes on to the server, and to
    /// `reply` the answer to a refused frame. Stops right after a refusal, so that it can be
    /// sent after the answers of the frames before it; returns the bytes consumed (the caller
    /// feeds the rest once the refusal is out).
    pub fn feed(&mut self, bytes: &[u8], pass: &mut Vec<u8>, reply: &mut Vec<u8>) -> usize {
        let mut i = 0;
        while i < bytes.len() {
            let rest = &bytes[i..];
            match self.at {
                At::Through => {
                    pass.extend_from_slice(rest);
                    i = bytes.len();
                }
                At::Pass(n) | At::Skip(n) => {
                    let k = n.min(rest.len());
                    if matches!(self.at, At::Pass(_)) {
                        pass.extend_from_slice(&rest[..k]);
                    }
                    i += k;
                    self.at = match (self.at, n - k) {
                        (_, 0) => At::Header,
                        (At::Pass(_), left) => At::Pass(left),
                        (_, left) => At::Skip(left),
                    };
                }
                At::Header => {
                    let k = (MBAP - self.have).min(rest.len());
                    self.header[self.have..self.have + k].copy_from_slice(&rest[..k]);
                    self.have += k;
                    i += k;
                    if self.have < MBAP {
                        continue;
                    }
                    self.have = 0;
                    let protocol = u16::from_be_bytes([self.header[2], self.header[3]]);
                    // The length counts the unit id and the PDU.
                    let len = u16::from_be_bytes([self.header[4], self.header[5]]) as usize;
                    if protocol != 0 || len < 2 {
                        pass.extend_from_slice(&self.header);
                        self.at = At::Through;
                    } else if len - 1 > MAX_PDU {
                        self.at = At::Function;
                    } else {
                        pass.extend_from_slice(&self.header);
                        self.at = At::Pass(len - 1);
                    }
                }
                At::Function => {
                    let function = rest[0];
                    i += 1;
                    let len = u16::from_be_bytes([self.header[4], self.header[5]]) as usize;
                    // The rest of the PDU (more than `MAX_PDU` bytes with its function code).
                    self.at = At::Skip(len - 2);
                    reply.extend_from_slice(&self.refusal(function));
                    return i;
                }
            }
        }
        i
    }

    /// The exception response to the frame whose header is held, of function `function`.
    fn refusal(&self, function: u8) -> [u8; MBAP + 2] {
        let unit = self.header[6];
        let code = if !tcp_unit_served(self.unit, unit) {
            0x0B // gateway target device failed to respond
        } else if matches!(function, 0x03 | 0x04 | 0x06 | 0x10 | 0x17 | 0x2B) {
            0x03 // illegal data value: a quantity beyond the protocol's
        } else {
            0x01 // illegal function
        };
        let h = &self.header;
        [h[0], h[1], 0, 0, 0, 3, unit, function | 0x80, code]
    }
}

/// A connection with a [`Guard`] between it and tokio-modbus: reads go through the guard, a
/// refusal is written to the master in its turn (after the answers of the frames before it),
/// writes go straight through.
pub struct Guarded<T> {
    inner: T,
    guard: Guard,
    stats: Arc<PortStats>,
    /// Read from the master, not yet fed to the guard.
    input: Vec<u8>,
    input_at: usize,
    /// For tokio-modbus.
    pass: Vec<u8>,
    pass_at: usize,
    /// For the master.
    reply: Vec<u8>,
    reply_at: usize,
    eof: bool,
}

impl<T> Guarded<T> {
    /// `inner` served for unit id `unit`; a refused frame is counted in `stats` as bad input.
    pub fn new(inner: T, unit: u8, stats: Arc<PortStats>) -> Guarded<T> {
        Guarded {
            inner,
            guard: Guard::new(unit),
            stats,
            input: Vec::new(),
            input_at: 0,
            pass: Vec::new(),
            pass_at: 0,
            reply: Vec::new(),
            reply_at: 0,
            eof: false,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            // The frames before a refusal first: tokio-modbus answers them, then asks for more.
            if me.pass_at < me.pass.len() {
                let k = (me.pass.len() - me.pass_at).min(buf.remaining());
                buf.put_slice(&me.pass[me.pass_at..me.pass_at + k]);
                me.pass_at += k;
                return Poll::Ready(Ok(()));
            }
            while me.reply_at < me.reply.len() {
                let n = ready!(Pin::new(&mut me.inner).poll_write(cx, &me.reply[me.reply_at..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                me.reply_at += n;
            }
            if me.input_at < me.input.len() {
                me.pass.clear();
                me.pass_at = 0;
                me.reply.clear();
                me.reply_at = 0;
                me.input_at += me
                    .guard
                    .feed(&me.input[me.input_at..], &mut me.pass, &mut me.reply);
                if !me.reply.is_empty() {
                    me.stats.bump(Count::BadInput);
                }
                continue;
            }
            if me.eof {
                return Poll::Ready(Ok(()));
            }
            me.input.resize(1024, 0);
            let mut rb = ReadBuf::new(&mut me.input);
            let read = Pin::new(&mut me.inner).poll_read(cx, &mut rb);
            let n = rb.filled().len();
            me.input.truncate(n);
            me.input_at = 0;
            ready!(read)?;
            me.eof = n == 0;
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An MBAP frame: transaction `tid`, unit `unit`, the PDU `pdu`.
    fn frame(tid: u16, unit: u8, pdu: &[u8]) -> Vec<u8> {
        let mut f = tid.to_be_bytes().to_vec();
        f.extend([0, 0]);
        f.extend(((pdu.len() + 1) as u16).to_be_bytes());
        f.push(unit);
        f.extend_from_slice(pdu);
        f
    }

    /// FC16 writing `n` registers at 256.
    fn fc16(n: usize) -> Vec<u8> {
        let mut p = vec![0x10, 0x01, 0x00];
        p.extend((n as u16).to_be_bytes());
        p.push((2 * n) as u8);
        p.extend(std::iter::repeat_n(0x41, 2 * n));
        p
    }

    /// Feeds `bytes` in pieces of `step`, as a refusal-aware reader would: (passed, replies).
    fn run(g: &mut Guard, bytes: &[u8], step: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
        let (mut pass, mut replies) = (Vec::new(), Vec::new());
        for piece in bytes.chunks(step) {
            let mut at = 0;
            while at < piece.len() {
                let mut reply = Vec::new();
                at += g.feed(&piece[at..], &mut pass, &mut reply);
                if !reply.is_empty() {
                    replies.push(reply);
                }
            }
        }
        (pass, replies)
    }

    #[test]
    fn a_write_of_124_registers_is_answered_0x03_and_the_frames_around_it_go_through() {
        let ok = frame(1, 7, &fc16(123));
        let over = frame(2, 7, &fc16(124));
        let read = frame(3, 7, &[0x03, 0x00, 0x00, 0x00, 0x03]);
        let stream = [ok.clone(), over, read.clone()].concat();
        for step in [1, 2, 7, 8, 100, stream.len()] {
            let (pass, replies) = run(&mut Guard::new(7), &stream, step);
            assert_eq!(pass, [ok.clone(), read.clone()].concat(), "step {step}");
            assert_eq!(
                replies,
                [vec![0, 2, 0, 0, 0, 3, 7, 0x90, 0x03]],
                "step {step}"
            );
        }
    }

    #[test]
    fn an_oversized_frame_of_another_unit_or_function_gets_their_exceptions() {
        let mut g = Guard::new(7);
        let (_, r) = run(&mut g, &frame(9, 8, &fc16(124)), 300);
        assert_eq!(r, [vec![0, 9, 0, 0, 0, 3, 8, 0x90, 0x0B]]);
        let (_, r) = run(&mut g, &frame(9, 0xFF, &fc16(124)), 300);
        assert_eq!(r, [vec![0, 9, 0, 0, 0, 3, 0xFF, 0x90, 0x03]]);
        let mut coils = vec![0x0F];
        coils.extend([0u8; 260]);
        let (_, r) = run(&mut g, &frame(5, 7, &coils), 300);
        assert_eq!(r, [vec![0, 5, 0, 0, 0, 3, 7, 0x8F, 0x01]]);
    }

    #[test]
    fn a_header_the_server_refuses_anyway_goes_through_untouched() {
        let mut bad = frame(1, 7, &fc16(124));
        bad[2] = 1; // another protocol id
        let (pass, replies) = run(&mut Guard::new(7), &bad, 5);
        assert_eq!(pass, bad);
        assert!(replies.is_empty());
    }
}
