//! The DVM secret and the connection handshake that proves knowledge of it.
//!
//! Handshake (both sides run the same steps, so it costs about two round trips):
//! 1. send `AuthHello { nonce: 32 fresh random bytes, rank, epoch }`;
//! 2. read the peer's hello (a nonce of the wrong length, or equal to ours, is refused);
//! 3. send `AuthProof { mac }` with
//!    `mac = HMAC-SHA256(secret, DOMAIN | role | own nonce | peer nonce | own rank | own epoch
//!    | own link security)`;
//! 4. read the peer's proof and verify it (constant time) against the peer's role, nonces,
//!    claimed rank, epoch and link security; then refuse a peer whose link security differs
//!    from ours (so nobody can talk a connection down to a weaker mode).
//!
//! The role byte (initiator or responder) keeps a proof made on one side of a connection from
//! being reflected as the other side's. Every message is `u32 BE length | prost message`,
//! capped at [`MAX_HANDSHAKE_MSG`] bytes, so garbage from an unauthenticated socket is refused
//! without buffering it. The whole exchange runs under a timeout.
//!
//! After it, both nonces key the connection's per-frame protection ([`crate::link`]): every
//! frame is verified (and, in `aead` mode, decrypted) with a per-direction sequence number.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use dvm_proto::rml::{AuthHello, AuthProof};
use hmac::{Hmac, Mac};
use prost::Message;
use rand::RngCore;
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::link::{LinkParams, LinkSecurity, Opener, Sealer};
use crate::topology::Rank;

/// Rank claimed by a tool client (prun, pterm) instead of a daemon rank.
pub const TOOL_RANK: Rank = u32::MAX;

/// Length of the DVM secret and of each handshake nonce.
pub const SECRET_LEN: usize = 32;
pub const NONCE_LEN: usize = 32;

/// Largest handshake message accepted from an unauthenticated peer.
pub const MAX_HANDSHAKE_MSG: usize = 1024;

/// Default bound on the whole handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

const DOMAIN: &[u8] = b"dvm-auth-v1";

type HmacSha256 = Hmac<Sha256>;

/// The DVM secret: 32 random bytes created at DVM start, shared by every daemon and tool.
#[derive(Clone, PartialEq, Eq)]
pub struct DvmSecret([u8; SECRET_LEN]);

impl std::fmt::Debug for DvmSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DvmSecret(<redacted>)")
    }
}

/// Why a secret could not be read, written or parsed.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("DVM secret file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("DVM secret file {path} has mode {mode:o}; it must not be readable by group or others (chmod 600)")]
    InsecurePermissions { path: PathBuf, mode: u32 },
    #[error("DVM secret must be {expected} hex digits, got {got}")]
    WrongLength { expected: usize, got: usize },
    #[error("DVM secret has a non-hex character at position {pos}")]
    BadHex { pos: usize },
}

impl DvmSecret {
    /// A fresh secret from the operating system's random source.
    pub fn generate() -> Self {
        let mut b = [0u8; SECRET_LEN];
        rand::rngs::OsRng.fill_bytes(&mut b);
        DvmSecret(b)
    }

    pub fn from_bytes(b: [u8; SECRET_LEN]) -> Self {
        DvmSecret(b)
    }

    pub fn as_bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }

    /// Lower-case hex, the form used in files, on stdin and in the environment.
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(2 * SECRET_LEN);
        for b in self.0 {
            s.push(DIGITS[(b >> 4) as usize] as char);
            s.push(DIGITS[(b & 0xf) as usize] as char);
        }
        s
    }

    /// Parse hex (either case); surrounding whitespace is ignored.
    pub fn from_hex(text: &str) -> Result<Self, SecretError> {
        let t = text.trim().as_bytes();
        if t.len() != 2 * SECRET_LEN {
            return Err(SecretError::WrongLength { expected: 2 * SECRET_LEN, got: t.len() });
        }
        let nibble = |pos: usize| -> Result<u8, SecretError> {
            match t[pos] {
                c @ b'0'..=b'9' => Ok(c - b'0'),
                c @ b'a'..=b'f' => Ok(c - b'a' + 10),
                c @ b'A'..=b'F' => Ok(c - b'A' + 10),
                _ => Err(SecretError::BadHex { pos }),
            }
        };
        let mut b = [0u8; SECRET_LEN];
        for (i, out) in b.iter_mut().enumerate() {
            *out = (nibble(2 * i)? << 4) | nibble(2 * i + 1)?;
        }
        Ok(DvmSecret(b))
    }

    /// Write the secret as hex to `path`, readable and writable by the owner only (0600).
    /// An existing file is replaced and its mode reset to 0600.
    pub fn write_file(&self, path: &Path) -> Result<(), SecretError> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let err = |source| SecretError::Io { path: path.to_owned(), source };
        let mut f =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(err)?;
        // `mode` applies only when the file is created; force it for a pre-existing file.
        f.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        writeln!(f, "{}", self.to_hex()).map_err(err)?;
        f.sync_all().map_err(err)
    }

    /// Read a secret written by [`DvmSecret::write_file`]. A file that group or others may
    /// read is refused: the secret would no longer be secret.
    pub fn read_file(path: &Path) -> Result<Self, SecretError> {
        use std::os::unix::fs::PermissionsExt;
        let err = |source| SecretError::Io { path: path.to_owned(), source };
        let mode = std::fs::metadata(path).map_err(err)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::InsecurePermissions { path: path.to_owned(), mode });
        }
        let text = std::fs::read_to_string(path).map_err(err)?;
        DvmSecret::from_hex(&text)
    }
}

/// Which end of the TCP connection a side is; part of every proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that called `connect`.
    Initiator,
    /// The side that accepted.
    Responder,
}

impl Role {
    pub(crate) fn byte(self) -> u8 {
        match self {
            Role::Initiator => b'I',
            Role::Responder => b'R',
        }
    }

    pub(crate) fn peer(self) -> Role {
        match self {
            Role::Initiator => Role::Responder,
            Role::Responder => Role::Initiator,
        }
    }
}

/// What an authenticated peer claimed, now backed by a valid proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIdentity {
    /// Daemon rank, or [`TOOL_RANK`] for a tool.
    pub rank: Rank,
    /// The peer's boot incarnation.
    pub epoch: u64,
}

impl PeerIdentity {
    pub fn is_tool(&self) -> bool {
        self.rank == TOOL_RANK
    }
}

/// Why a handshake failed. Nothing the peer sent is acted on in any of these cases.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("handshake timed out after {0:?}")]
    Timeout(Duration),
    #[error("i/o during handshake: {0}")]
    Io(#[from] io::Error),
    #[error("the peer closed the connection during the handshake (not a daemon of this DVM, or a listener flooded with connections that closed this one)")]
    ClosedByPeer,
    #[error("handshake message of {size} bytes exceeds the limit of {max}")]
    MessageTooLarge { size: usize, max: usize },
    #[error("malformed handshake message: {0}")]
    Malformed(String),
    #[error("peer nonce has {0} bytes, expected {NONCE_LEN}")]
    BadNonce(usize),
    #[error("peer echoed our own nonce (reflection)")]
    ReflectedNonce,
    #[error("peer claiming rank {claimed} failed to prove knowledge of the DVM secret")]
    BadProof { claimed: Rank },
    #[error("peer rank {peer} runs link security {theirs}, this daemon {ours} (--link-security must be the same on every daemon)")]
    LinkSecurityMismatch { peer: Rank, ours: LinkSecurity, theirs: String },
}

impl AuthError {
    /// True when retrying the same peer cannot help (it does not hold our secret).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            AuthError::BadProof { .. }
                | AuthError::ReflectedNonce
                | AuthError::BadNonce(_)
                | AuthError::LinkSecurityMismatch { .. }
        )
    }
}

/// What one side claims in its hello and proves in its proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    pub role: Role,
    pub own_nonce: &'a [u8],
    pub peer_nonce: &'a [u8],
    pub rank: Rank,
    pub epoch: u64,
    /// The link security value of the hello (see [`LinkSecurity::wire`]).
    pub link_security: u32,
}

/// The MAC one side sends: binds the secret to both fresh nonces, the sender's role, rank,
/// epoch and link security.
pub fn proof_mac(secret: &DvmSecret, claim: &Claim<'_>) -> [u8; 32] {
    keyed(secret, claim).finalize().into_bytes().into()
}

fn keyed(secret: &DvmSecret, c: &Claim<'_>) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(DOMAIN);
    mac.update(&[c.role.byte()]);
    mac.update(c.own_nonce);
    mac.update(c.peer_nonce);
    mac.update(&c.rank.to_be_bytes());
    mac.update(&c.epoch.to_be_bytes());
    mac.update(&c.link_security.to_be_bytes());
    mac
}

/// A successful handshake: who the peer is and what keys its frames.
pub struct Established {
    pub peer: PeerIdentity,
    role: Role,
    mode: LinkSecurity,
    own_nonce: [u8; NONCE_LEN],
    peer_nonce: [u8; NONCE_LEN],
}

impl Established {
    /// The connection's link protection: a sealer for what this side sends, an opener for
    /// what it receives, frames up to `max_frame` bytes.
    pub fn link(&self, secret: &DvmSecret, max_frame: usize) -> (Sealer, Opener) {
        self.params(secret).keys(max_frame)
    }

    /// The key-derivation inputs of this connection.
    pub fn params<'a>(&'a self, secret: &'a DvmSecret) -> LinkParams<'a> {
        let (initiator_nonce, responder_nonce) = match self.role {
            Role::Initiator => (&self.own_nonce[..], &self.peer_nonce[..]),
            Role::Responder => (&self.peer_nonce[..], &self.own_nonce[..]),
        };
        LinkParams { secret, mode: self.mode, role: self.role, initiator_nonce, responder_nonce }
    }
}

/// What this side brings to a handshake.
#[derive(Debug, Clone, Copy)]
pub struct Local<'a> {
    pub secret: &'a DvmSecret,
    pub role: Role,
    pub rank: Rank,
    pub epoch: u64,
    pub mode: LinkSecurity,
}

/// Run the handshake on `stream`, bounded by `timeout`. Returns the peer's proven identity
/// and the connection's key material; the caller decides whether that rank is welcome (a
/// daemon listener refuses tools, a dialer checks it reached the rank it meant).
pub async fn handshake<S>(stream: &mut S, local: Local<'_>, timeout: Duration) -> Result<Established, AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(timeout, exchange(stream, local)).await {
        Ok(r) => r,
        Err(_) => Err(AuthError::Timeout(timeout)),
    }
}

async fn exchange<S>(stream: &mut S, me: Local<'_>) -> Result<Established, AuthError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut nonce = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    let hello =
        AuthHello { nonce: nonce.to_vec().into(), rank: me.rank, epoch: me.epoch, link_security: me.mode.wire() };
    write_msg(stream, &hello).await?;

    let peer: AuthHello = read_msg(stream).await?;
    let Ok(peer_nonce) = <[u8; NONCE_LEN]>::try_from(&peer.nonce[..]) else {
        return Err(AuthError::BadNonce(peer.nonce.len()));
    };
    if peer_nonce == nonce {
        return Err(AuthError::ReflectedNonce);
    }

    let mine = Claim {
        role: me.role,
        own_nonce: &nonce,
        peer_nonce: &peer_nonce,
        rank: me.rank,
        epoch: me.epoch,
        link_security: me.mode.wire(),
    };
    write_msg(stream, &AuthProof { mac: proof_mac(me.secret, &mine).to_vec().into() }).await?;

    let proof: AuthProof = read_msg(stream).await?;
    let theirs = Claim {
        role: me.role.peer(),
        own_nonce: &peer_nonce,
        peer_nonce: &nonce,
        rank: peer.rank,
        epoch: peer.epoch,
        link_security: peer.link_security,
    };
    keyed(me.secret, &theirs).verify_slice(&proof.mac).map_err(|_| AuthError::BadProof { claimed: peer.rank })?;
    if LinkSecurity::from_wire(peer.link_security) != Some(me.mode) {
        let theirs = LinkSecurity::from_wire(peer.link_security)
            .map_or_else(|| format!("unknown ({})", peer.link_security), |m| m.to_string());
        return Err(AuthError::LinkSecurityMismatch { peer: peer.rank, ours: me.mode, theirs });
    }
    Ok(Established {
        peer: PeerIdentity { rank: peer.rank, epoch: peer.epoch },
        role: me.role,
        mode: me.mode,
        own_nonce: nonce,
        peer_nonce,
    })
}

async fn write_msg<S, M>(stream: &mut S, msg: &M) -> Result<(), AuthError>
where
    S: AsyncWrite + Unpin,
    M: Message,
{
    let mut buf = BytesMut::with_capacity(4 + msg.encoded_len());
    buf.put_u32(msg.encoded_len() as u32);
    msg.encode(&mut buf).expect("BytesMut grows on demand");
    stream.write_all(&buf).await?;
    stream.flush().await?;
    Ok(())
}

/// A read that ended because the peer closed (EOF) or reset the connection is named as such.
fn closed(e: io::Error) -> AuthError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => AuthError::ClosedByPeer,
        _ => AuthError::Io(e),
    }
}

async fn read_msg<S, M>(stream: &mut S) -> Result<M, AuthError>
where
    S: AsyncRead + Unpin,
    M: Message + Default,
{
    let size = stream.read_u32().await.map_err(closed)? as usize;
    if size > MAX_HANDSHAKE_MSG {
        return Err(AuthError::MessageTooLarge { size, max: MAX_HANDSHAKE_MSG });
    }
    let mut buf = vec![0u8; size];
    stream.read_exact(&mut buf).await.map_err(closed)?;
    M::decode(&buf[..]).map_err(|e| AuthError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_errors() {
        let s = DvmSecret::generate();
        assert_eq!(DvmSecret::from_hex(&format!("  {}\n", s.to_hex().to_uppercase())).unwrap(), s);
        assert!(matches!(DvmSecret::from_hex("ab"), Err(SecretError::WrongLength { got: 2, .. })));
        let mut bad = s.to_hex();
        bad.replace_range(5..6, "g");
        assert!(matches!(DvmSecret::from_hex(&bad), Err(SecretError::BadHex { pos: 5 })));
    }

    #[test]
    fn proofs_differ_by_role_rank_epoch_mode_and_nonce_order() {
        let s = DvmSecret::generate();
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let c = Claim { role: Role::Initiator, own_nonce: &a, peer_nonce: &b, rank: 4, epoch: 1, link_security: 3 };
        let base = proof_mac(&s, &c);
        assert_ne!(base, proof_mac(&s, &Claim { role: Role::Responder, ..c }));
        assert_ne!(base, proof_mac(&s, &Claim { own_nonce: &b, peer_nonce: &a, ..c }));
        assert_ne!(base, proof_mac(&s, &Claim { rank: 5, ..c }));
        assert_ne!(base, proof_mac(&s, &Claim { epoch: 2, ..c }));
        assert_ne!(base, proof_mac(&s, &Claim { link_security: 2, ..c }));
        assert_ne!(base, proof_mac(&DvmSecret::generate(), &c));
        assert_eq!(base, proof_mac(&s, &c));
    }

    #[test]
    fn secret_file_is_private_and_reads_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("dvm-rml-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let s = DvmSecret::generate();
        s.write_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(DvmSecret::read_file(&path).unwrap(), s);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(DvmSecret::read_file(&path), Err(SecretError::InsecurePermissions { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn local(secret: &DvmSecret, role: Role, rank: Rank, epoch: u64, mode: LinkSecurity) -> Local<'_> {
        Local { secret, role, rank, epoch, mode }
    }

    #[tokio::test]
    async fn handshake_over_a_pipe() {
        let secret = DvmSecret::generate();
        let (mut a, mut b) = tokio::io::duplex(4096);
        let t = Duration::from_secs(10);
        let s2 = secret.clone();
        let aead = LinkSecurity::Aead;
        let other =
            tokio::spawn(
                async move { handshake(&mut b, local(&s2, Role::Responder, 0, 9, aead), t).await.map(|e| e.peer) },
            );
        let got = handshake(&mut a, local(&secret, Role::Initiator, TOOL_RANK, 0, aead), t).await.unwrap();
        assert_eq!(got.peer, PeerIdentity { rank: 0, epoch: 9 });
        let theirs = other.await.unwrap().unwrap();
        assert!(theirs.is_tool());

        let (mut a, mut b) = tokio::io::duplex(4096);
        let wrong = DvmSecret::generate();
        let other = tokio::spawn(async move {
            handshake(&mut b, local(&wrong, Role::Responder, 0, 9, aead), t).await.map(|e| e.peer)
        });
        let mine = handshake(&mut a, local(&secret, Role::Initiator, 3, 1, aead), t).await;
        assert!(matches!(mine, Err(AuthError::BadProof { claimed: 0 })));
        assert!(matches!(other.await.unwrap(), Err(AuthError::BadProof { claimed: 3 })));
    }

    #[tokio::test]
    async fn different_link_security_is_refused_by_both_sides() {
        let secret = DvmSecret::generate();
        let (mut a, mut b) = tokio::io::duplex(4096);
        let t = Duration::from_secs(10);
        let s2 = secret.clone();
        let other = tokio::spawn(async move {
            handshake(&mut b, local(&s2, Role::Responder, 0, 9, LinkSecurity::Mac), t).await.map(|e| e.peer)
        });
        let mine = handshake(&mut a, local(&secret, Role::Initiator, 3, 1, LinkSecurity::Aead), t).await;
        assert!(matches!(mine, Err(AuthError::LinkSecurityMismatch { peer: 0, .. })));
        let theirs = other.await.unwrap();
        assert!(matches!(theirs, Err(AuthError::LinkSecurityMismatch { peer: 3, .. })), "{theirs:?}");
        assert!(theirs.unwrap_err().is_refusal());
    }
}
