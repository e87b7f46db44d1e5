//! The server side of one WebSocket connection (RFC 6455), as much as NNI's dispatcher uses:
//! the opening handshake, text and binary messages (fragmented or not), ping/pong and close.
//! NNI's client is Python's `websockets`, which pings every 20 s and masks its frames; no
//! extension is negotiated (the handshake answers none), so frames are plain.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use base64::Engine;
use sha1::Digest;

/// The GUID every WebSocket server appends to the client's key (RFC 6455 section 1.3).
const ACCEPT_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The longest message accepted: NNI's own payloads are a few kilobytes (it refuses parameters
/// over 64 KiB), so a larger one is a broken peer, not a big search space.
const MAX_MESSAGE: u64 = 64 * 1024 * 1024;

/// The longest handshake request accepted, in bytes.
const MAX_REQUEST: usize = 64 * 1024;

#[derive(Debug)]
pub enum WsError {
    Io(std::io::Error),
    Protocol(String),
}

impl std::fmt::Display for WsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WsError::Io(e) => write!(f, "{e}"),
            WsError::Protocol(message) => f.write_str(message),
        }
    }
}

impl From<std::io::Error> for WsError {
    fn from(e: std::io::Error) -> WsError {
        WsError::Io(e)
    }
}

/// Reads the client's opening handshake from `stream` and answers it; returns the request path.
pub fn accept(stream: &mut TcpStream) -> Result<String, WsError> {
    // `take`: a line that never ends must not grow without bound either.
    let mut reader = BufReader::new(stream.try_clone()?.take(MAX_REQUEST as u64 + 1));
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let path = request_line
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| WsError::Protocol(format!("not an HTTP request: {request_line:?}")))?
        .to_owned();
    let mut key = None;
    let mut read = request_line.len();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line)?;
        read += n;
        if read > MAX_REQUEST {
            return Err(WsError::Protocol(format!(
                "a handshake request of more than {MAX_REQUEST} bytes"
            )));
        }
        if n == 0 {
            return Err(WsError::Protocol(
                "the handshake request ended early".into(),
            ));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("sec-websocket-key") {
                key = Some(value.trim().to_owned());
            }
        }
    }
    // The handshake is exactly one request; nothing follows it before our answer.
    if !reader.buffer().is_empty() {
        return Err(WsError::Protocol("data after the handshake request".into()));
    }
    let key = key.ok_or_else(|| WsError::Protocol("no Sec-WebSocket-Key".into()))?;
    let mut sha = sha1::Sha1::new();
    sha.update(key.as_bytes());
    sha.update(ACCEPT_GUID.as_bytes());
    let accept = base64::engine::general_purpose::STANDARD.encode(sha.finalize());
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    stream.write_all(response.as_bytes())?;
    Ok(path)
}

/// What the peer sent.
#[derive(Debug, PartialEq)]
pub enum Message {
    Text(String),
    /// The peer closed the connection (a close frame, or the socket ended).
    Closed(String),
}

/// Reads the next message; answers pings (through `writer`) on the way.
pub fn read_message(reader: &mut impl Read, writer: &Writer) -> Result<Message, WsError> {
    let mut message = Vec::new();
    let mut fragmented = false;
    loop {
        let mut head = [0u8; 2];
        if let Err(e) = reader.read_exact(&mut head) {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                return Ok(Message::Closed("the connection ended".into()));
            }
            return Err(e.into());
        }
        let fin = head[0] & 0x80 != 0;
        let opcode = head[0] & 0x0f;
        let masked = head[1] & 0x80 != 0;
        let mut len = u64::from(head[1] & 0x7f);
        if len == 126 {
            let mut ext = [0u8; 2];
            reader.read_exact(&mut ext)?;
            len = u64::from(u16::from_be_bytes(ext));
        } else if len == 127 {
            let mut ext = [0u8; 8];
            reader.read_exact(&mut ext)?;
            len = u64::from_be_bytes(ext);
        }
        // Saturating: a 64-bit length from the peer must not wrap past the bound.
        if len.saturating_add(message.len() as u64) > MAX_MESSAGE {
            return Err(WsError::Protocol(format!(
                "a message of more than {MAX_MESSAGE} bytes"
            )));
        }
        let mut mask = [0u8; 4];
        if masked {
            reader.read_exact(&mut mask)?;
        }
        let mut payload = vec![0u8; len as usize];
        reader.read_exact(&mut payload)?;
        if masked {
            for (i, byte) in payload.iter_mut().enumerate() {
                *byte ^= mask[i % 4];
            }
        }
        match opcode {
            // Continuation, text, binary: the dispatcher's JSON either way.
            0x0..=0x2 => {
                if opcode != 0 && fragmented {
                    return Err(WsError::Protocol(
                        "a new message inside a fragmented one".into(),
                    ));
                }
                message.extend_from_slice(&payload);
                if fin {
                    return String::from_utf8(message)
                        .map(Message::Text)
                        .map_err(|_| WsError::Protocol("a message that is not UTF-8".into()));
                }
                fragmented = true;
            }
            0x8 => {
                let reason = String::from_utf8_lossy(payload.get(2..).unwrap_or_default());
                // Answer the close, and as the server close the TCP connection (RFC 6455
                // 7.1.1): nni's client (`websockets`) waits for that, up to its 10 s close
                // timeout, before its process can exit. The peer may already be gone.
                let _ = writer.frame(0x8, payload.get(..2).unwrap_or_default());
                writer.shutdown();
                return Ok(Message::Closed(if reason.is_empty() {
                    "closed by the dispatcher".into()
                } else {
                    format!("closed by the dispatcher: {reason}")
                }));
            }
            0x9 => writer.frame(0xA, &payload)?,
            0xA => {}
            other => return Err(WsError::Protocol(format!("unknown frame opcode {other}"))),
        }
    }
}

/// The writing half, shared by the threads that send. It exists before the dispatcher
/// connects (Python, nni and the algorithm's constructor take seconds, a user's model minutes,
/// and the host's loop does not wait for them): what is sent meanwhile is kept, in order, and
/// goes out as the connection opens.
#[derive(Debug)]
pub struct Writer(std::sync::Mutex<Sink>);

#[derive(Debug)]
enum Sink {
    /// Not connected yet: the frames sent so far.
    Connecting(Vec<Vec<u8>>),
    Open(TcpStream),
    /// Closed, or given up before it connected.
    Closed,
}

impl Writer {
    /// A writer whose stream comes later ([`Writer::open`]).
    pub fn connecting() -> Writer {
        Writer(std::sync::Mutex::new(Sink::Connecting(Vec::new())))
    }

    /// Sends what was kept, in order, then writes straight to `stream`. A writer closed
    /// meanwhile stays closed (the stream is shut down).
    pub fn open(&self, mut stream: TcpStream) -> Result<(), WsError> {
        let mut sink = self.lock();
        match std::mem::replace(&mut *sink, Sink::Closed) {
            Sink::Connecting(kept) => {
                for frame in kept {
                    stream.write_all(&frame)?;
                }
                stream.flush()?;
                *sink = Sink::Open(stream);
                Ok(())
            }
            Sink::Open(_) | Sink::Closed => {
                let _ = stream.shutdown(std::net::Shutdown::Both);
                Err(WsError::Io(std::io::ErrorKind::NotConnected.into()))
            }
        }
    }

    /// Whether the connection is still to come (neither open nor closed).
    pub fn is_connecting(&self) -> bool {
        matches!(*self.lock(), Sink::Connecting(_))
    }

    /// Whether the connection is open (not still to come, not closed).
    pub fn is_open(&self) -> bool {
        matches!(*self.lock(), Sink::Open(_))
    }

    pub fn text(&self, text: &str) -> Result<(), WsError> {
        self.frame(0x1, text.as_bytes())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sink> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends one unfragmented, unmasked frame (a server never masks).
    fn frame(&self, opcode: u8, payload: &[u8]) -> Result<(), WsError> {
        let mut frame = Vec::with_capacity(payload.len() + 10);
        frame.push(0x80 | opcode);
        match payload.len() {
            n if n < 126 => frame.push(n as u8),
            n if n <= usize::from(u16::MAX) => {
                frame.push(126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        frame.extend_from_slice(payload);
        match &mut *self.lock() {
            Sink::Connecting(kept) => kept.push(frame),
            Sink::Open(stream) => {
                stream.write_all(&frame)?;
                stream.flush()?;
            }
            Sink::Closed => return Err(WsError::Io(std::io::ErrorKind::NotConnected.into())),
        }
        Ok(())
    }

    /// Sends a close frame and shuts the socket down; a connection still to come is refused.
    pub fn close(&self) {
        if self.is_open() {
            let _ = self.frame(0x8, &1000u16.to_be_bytes());
        }
        self.shutdown();
    }

    fn shutdown(&self) {
        let mut sink = self.lock();
        if let Sink::Open(stream) = &*sink {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        *sink = Sink::Closed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A writer for `read_message`'s pings and closes: one end of a real socket pair.
    fn writer() -> (Writer, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        let writer = Writer::connecting();
        writer.open(ours).unwrap();
        (writer, peer)
    }

    #[test]
    fn a_frame_longer_than_any_message_is_refused_before_it_is_read() {
        let (writer, _peer) = writer();
        for len in [u64::MAX, MAX_MESSAGE + 1] {
            let mut frame = vec![0x81, 127];
            frame.extend_from_slice(&len.to_be_bytes());
            let error = read_message(&mut frame.as_slice(), &writer).unwrap_err();
            assert!(
                error.to_string().contains("a message of more than"),
                "{len}: {error}"
            );
        }
    }

    #[test]
    fn a_handshake_line_that_never_ends_is_refused_at_the_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut ours, _) = listener.accept().unwrap();
        let sender = std::thread::spawn(move || {
            let _ = peer.write_all(format!("GET /{}", "x".repeat(2 * MAX_REQUEST)).as_bytes());
            peer
        });
        let error = accept(&mut ours).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("a handshake request of more than"),
            "{error}"
        );
        drop(sender.join());
    }

    #[test]
    fn a_close_is_answered_and_the_connection_then_closed() {
        let (writer, mut peer) = writer();
        // The client's close, code 4000 (nni's), masked as a client's frames are.
        let mask = [9u8, 8, 7, 6];
        let payload = [0x0f, 0xa0, b'b', b'y', b'e'];
        let mut frame = vec![0x88, 0x80 | payload.len() as u8];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
        let message = read_message(&mut frame.as_slice(), &writer).unwrap();
        assert_eq!(
            message,
            Message::Closed("closed by the dispatcher: bye".into())
        );
        // The answer, the same code, and then the end of the stream: nni's client waits for both.
        peer.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut received = Vec::new();
        peer.read_to_end(&mut received).unwrap();
        assert_eq!(received, [0x88, 2, 0x0f, 0xa0]);
    }

    #[test]
    fn a_masked_text_frame_is_read() {
        let (writer, _peer) = writer();
        let mask = [1u8, 2, 3, 4];
        let mut frame = vec![0x81, 0x80 | 2];
        frame.extend_from_slice(&mask);
        frame.extend(b"hi".iter().zip(mask).map(|(b, m)| b ^ m));
        let message = read_message(&mut frame.as_slice(), &writer).unwrap();
        assert_eq!(message, Message::Text("hi".into()));
    }
}
