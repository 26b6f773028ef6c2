//! A tampering TCP proxy for tests: put between two daemons with `TransportConfig::dial_via`
//! (`DVM_TEST_DIAL_VIA` for a dvmd HNP), it reads the real destination from the first line,
//! relays both directions, and can alter, replay or drop one whole frame the dialer sends
//! after the handshake. Plain threads and std sockets, so daemon tests use it too (by path).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What the proxy does to the next frame from the dialer once armed (then it passes again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tamper {
    /// Flip one bit in the middle of the frame's body.
    Flip,
    /// Forward the frame, then the same bytes again.
    Replay,
    /// Do not forward the frame.
    Drop,
}

#[derive(Default)]
struct State {
    armed: Mutex<Option<Tamper>>,
    /// Frames tampered with so far.
    fired: AtomicU64,
    /// Frames from the dialer forwarded after a handshake.
    frames: AtomicU64,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
}

pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

/// Handshake messages a dialer sends before its first frame: hello and proof.
const HANDSHAKE_MSGS: usize = 2;

impl Proxy {
    pub fn start() -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let state = Arc::new(State::default());
        let st = state.clone();
        let accept = std::thread::spawn(move || {
            for conn in l.incoming() {
                if st.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || relay(client, st));
            }
        });
        Proxy { addr, state, accept: Some(accept) }
    }

    /// Apply `t` to the next frame the dialer sends.
    pub fn arm(&self, t: Tamper) {
        *self.state.armed.lock().unwrap() = Some(t);
    }

    pub fn fired(&self) -> u64 {
        self.state.fired.load(Ordering::SeqCst)
    }

    pub fn frames(&self) -> u64 {
        self.state.frames.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        for c in self.state.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        // Wake the accept loop so it sees `stop`.
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn relay(client: TcpStream, st: Arc<State>) {
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || st.stop.load(Ordering::SeqCst) {
        return;
    }
    let Ok(target) = line.trim().parse::<SocketAddr>() else { return };
    let Ok(server) = TcpStream::connect(target) else { return };
    {
        let mut conns = st.conns.lock().unwrap();
        conns.push(client.try_clone().unwrap());
        conns.push(server.try_clone().unwrap());
    }
    let (mut s_read, mut c_write) = (server.try_clone().unwrap(), client.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut s_read, &mut c_write);
        let _ = c_write.shutdown(Shutdown::Write);
    });
    let mut to_server = server;
    let _ = forward_frames(&mut reader, &mut to_server, &st);
    let _ = to_server.shutdown(Shutdown::Write);
}

/// Read one `u32 BE len | body` message.
fn read_msg(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let n = u32::from_be_bytes(len) as usize;
    let mut msg = vec![0u8; 4 + n];
    msg[..4].copy_from_slice(&len);
    r.read_exact(&mut msg[4..])?;
    Ok(msg)
}

fn forward_frames(r: &mut impl Read, w: &mut TcpStream, st: &State) -> std::io::Result<()> {
    for _ in 0..HANDSHAKE_MSGS {
        w.write_all(&read_msg(r)?)?;
    }
    loop {
        let mut msg = read_msg(r)?;
        let action = st.armed.lock().unwrap().take();
        // Counted before the bytes leave, so a test that saw the effect sees the count.
        st.frames.fetch_add(1, Ordering::SeqCst);
        if action.is_some() {
            st.fired.fetch_add(1, Ordering::SeqCst);
        }
        match action {
            None => w.write_all(&msg)?,
            Some(Tamper::Flip) => {
                let mid = (4 + (msg.len() - 4) / 2).min(msg.len() - 1);
                msg[mid] ^= 0x10;
                w.write_all(&msg)?;
            }
            Some(Tamper::Replay) => {
                w.write_all(&msg)?;
                w.write_all(&msg)?;
            }
            Some(Tamper::Drop) => {}
        }
    }
}
