//! The communicator's unique id (made by rank 0, passed out of band like NCCL's) and the
//! torchrun environment.

use std::ffi::c_char;
use std::hash::{BuildHasher, Hasher};
use std::io::Read;

use crate::error::Error;

/// Bytes in an [`Id`], as in NCCL's `ncclUniqueId`.
pub const ID_BYTES: usize = 128;
const MAGIC: &[u8; 8] = b"PURLIN\x00\x01";
/// Session bytes (random, or derived from the torchrun environment).
const SESSION: std::ops::Range<usize> = 8..24;

/// A communicator's unique id: rank 0 makes one with [`Id::new`] and passes it to the other
/// ranks out of band (a file, an environment variable, a torch store). Same shape as
/// `cudarc::nccl::Id`: 128 bytes, [`Id::uninit`] rebuilds it from [`Id::internal`].
///
/// It names the rendezvous socket (abstract Unix namespace, so nothing on disk) and
/// authenticates the ranks that meet there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Id {
    internal: [c_char; ID_BYTES],
}

impl Id {
    /// A fresh id with 16 random bytes (from `/dev/urandom`).
    pub fn new() -> Result<Self, Error> {
        let mut session = [0u8; 16];
        fill_random(&mut session)?;
        Ok(Self::from_session(session))
    }

    /// An id from the 128 bytes of another rank's [`Id::internal`] (cudarc's name).
    pub fn uninit(internal: [c_char; ID_BYTES]) -> Self {
        Self { internal }
    }

    /// The id's 128 bytes, to send to the other ranks.
    pub fn internal(&self) -> &[c_char; ID_BYTES] {
        &self.internal
    }

    /// The id's bytes as `u8`.
    pub fn to_bytes(&self) -> [u8; ID_BYTES] {
        self.internal.map(|c| c as u8)
    }

    /// Rebuilds an id from [`Id::to_bytes`], checking that it is a Purlin id.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        let arr: [u8; ID_BYTES] = bytes
            .try_into()
            .map_err(|_| Error::InvalidArgument(format!("an Id is {ID_BYTES} bytes, got {}", bytes.len())))?;
        let id = Self { internal: arr.map(|b| b as c_char) };
        id.check()?;
        Ok(id)
    }

    /// Hex text (256 characters), e.g. to pass through an environment variable.
    pub fn to_hex(&self) -> String {
        self.to_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`Id::to_hex`].
    pub fn from_hex(text: &str) -> Result<Self, Error> {
        let text = text.trim();
        if text.len() != 2 * ID_BYTES || !text.is_ascii() {
            return Err(Error::InvalidArgument(format!("an Id in hex is {} characters", 2 * ID_BYTES)));
        }
        let bytes = (0..ID_BYTES)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|e| Error::InvalidArgument(format!("Id hex: {e}")))?;
        Self::from_bytes(&bytes)
    }

    /// The `n`-th id derived from this one. Every rank derives the same ids, so one
    /// out-of-band exchange can serve many communicators (made one after another or side by
    /// side); `derive(n)` never equals `self` or `derive(m)` for `m != n` (up to hash
    /// collisions of 128 bits).
    pub fn derive(&self, n: u64) -> Id {
        let s = self.session();
        let mut h1 = fnv1a(0xcbf2_9ce4_8422_2325, b"purlin-derive\0");
        h1 = fnv1a(h1, &s);
        h1 = fnv1a(h1, &n.to_le_bytes());
        let h2 = fnv1a(h1 ^ 0x9e37_79b9_7f4a_7c15, &s);
        let mut session = [0u8; 16];
        session[..8].copy_from_slice(&h1.to_le_bytes());
        session[8..].copy_from_slice(&h2.to_le_bytes());
        Id::from_session(session)
    }

    pub(crate) fn from_session(session: [u8; 16]) -> Self {
        let mut bytes = [0u8; ID_BYTES];
        bytes[..8].copy_from_slice(MAGIC);
        bytes[SESSION].copy_from_slice(&session);
        Self { internal: bytes.map(|b| b as c_char) }
    }

    /// Fails unless this is a Purlin id (e.g. an NCCL id passed by mistake).
    pub(crate) fn check(&self) -> Result<(), Error> {
        if self.to_bytes()[..8] != MAGIC[..] {
            return Err(Error::InvalidArgument("not a Purlin Id (bad magic): make it with Id::new() on rank 0".into()));
        }
        Ok(())
    }

    pub(crate) fn session(&self) -> [u8; 16] {
        let b = self.to_bytes();
        let mut s = [0u8; 16];
        s.copy_from_slice(&b[SESSION]);
        s
    }

    /// The abstract-namespace socket name rank 0 listens on.
    pub(crate) fn socket_name(&self) -> String {
        let hex: String = self.session().iter().map(|b| format!("{b:02x}")).collect();
        format!("purlin-{hex}")
    }
}

fn fill_random(out: &mut [u8]) -> Result<(), Error> {
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(out)) {
        Ok(()) => Ok(()),
        Err(_) => {
            // Fallback: std's randomly keyed hasher, the time and the pid.
            for (i, chunk) in out.chunks_mut(8).enumerate() {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_usize(i);
                h.write_u32(std::process::id());
                h.write_u128(
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
                );
                let v = h.finish().to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
            Ok(())
        }
    }
}

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What torchrun (`torch.distributed.run`) tells each process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchEnv {
    /// `RANK`.
    pub rank: usize,
    /// `WORLD_SIZE`.
    pub world_size: usize,
    /// `LOCAL_RANK`: the GPU this process drives.
    pub local_rank: usize,
    /// `LOCAL_WORLD_SIZE`: ranks on this node (`WORLD_SIZE` where unset: one node).
    pub local_world_size: usize,
    /// `MASTER_ADDR`.
    pub master_addr: String,
    /// `MASTER_PORT` (never bound by Purlin: torchrun's store already serves there).
    pub master_port: u16,
    /// `TORCHELASTIC_RUN_ID`, if set.
    pub run_id: Option<String>,
    /// `TORCHELASTIC_RESTART_COUNT`, if set (a restarted job meets on a new name).
    pub restart_count: Option<String>,
}

impl TorchEnv {
    /// Reads the process environment.
    pub fn from_process() -> Result<Self, Error> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        fn num<T: std::str::FromStr>(get: &impl Fn(&str) -> Option<String>, var: &'static str) -> Result<T, Error>
        where
            T::Err: std::fmt::Display,
        {
            let text =
                get(var).ok_or(Error::Env { var, problem: "not set (is this process started by torchrun?)".into() })?;
            text.trim().parse().map_err(|e| Error::Env { var, problem: format!("{text:?}: {e}") })
        }
        let env = Self {
            rank: num(&get, "RANK")?,
            world_size: num(&get, "WORLD_SIZE")?,
            local_rank: num(&get, "LOCAL_RANK")?,
            local_world_size: match get("LOCAL_WORLD_SIZE") {
                Some(_) => num(&get, "LOCAL_WORLD_SIZE")?,
                None => num(&get, "WORLD_SIZE")?,
            },
            master_addr: get("MASTER_ADDR").ok_or(Error::Env {
                var: "MASTER_ADDR",
                problem: "not set (is this process started by torchrun?)".into(),
            })?,
            master_port: num(&get, "MASTER_PORT")?,
            run_id: get("TORCHELASTIC_RUN_ID"),
            restart_count: get("TORCHELASTIC_RESTART_COUNT"),
        };
        if env.world_size == 0 || env.rank >= env.world_size {
            return Err(Error::Env {
                var: "RANK",
                problem: format!("rank {} is not below WORLD_SIZE {}", env.rank, env.world_size),
            });
        }
        if env.local_world_size == 0 || env.local_world_size > env.world_size {
            return Err(Error::Env {
                var: "LOCAL_WORLD_SIZE",
                problem: format!("{} with WORLD_SIZE {}", env.local_world_size, env.world_size),
            });
        }
        Ok(env)
    }

    /// Refuses a world that spans nodes (`LOCAL_WORLD_SIZE` below `WORLD_SIZE`): one
    /// single-kernel communicator is intra-node; `HierComm::from_env` composes nodes.
    pub fn check_one_node(&self) -> Result<(), Error> {
        if self.local_world_size != self.world_size {
            return Err(Error::Unsupported(format!(
                "WORLD_SIZE {} spans several nodes (LOCAL_WORLD_SIZE {}); Comm is intra-node: use HierComm::from_env \
                 (Purlin inside each node, NCCL between nodes; docs/multi-node.md)",
                self.world_size, self.local_world_size
            )));
        }
        Ok(())
    }

    /// The GPU this process should drive, given how many it sees: `LOCAL_RANK`, or GPU 0
    /// when the launcher left each process exactly one GPU (`CUDA_VISIBLE_DEVICES` per rank).
    pub fn device_ordinal(&self, visible: usize) -> Result<usize, Error> {
        match visible {
            0 => Err(Error::Env { var: "LOCAL_RANK", problem: "this process sees no GPU".into() }),
            1 => Ok(0),
            n if self.local_rank < n => Ok(self.local_rank),
            n => Err(Error::Env {
                var: "LOCAL_RANK",
                problem: format!("{} but this process sees {n} GPUs", self.local_rank),
            }),
        }
    }

    /// The id every rank derives alike for its `seq`-th communicator of this job: the
    /// rendezvous name comes from MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID (and the
    /// restart count), never from a socket on MASTER_PORT.
    pub fn id(&self, seq: u64) -> Id {
        let mut h1 = fnv1a(0xcbf2_9ce4_8422_2325, b"purlin-torchrun\0");
        for part in [
            self.master_addr.as_bytes(),
            &self.master_port.to_le_bytes(),
            self.run_id.as_deref().unwrap_or("").as_bytes(),
            self.restart_count.as_deref().unwrap_or("").as_bytes(),
            &(self.world_size as u64).to_le_bytes(),
            &seq.to_le_bytes(),
        ] {
            h1 = fnv1a(h1, part);
            h1 = fnv1a(h1, &[0xff]);
        }
        let h2 = fnv1a(h1 ^ 0x9e37_79b9_7f4a_7c15, b"second half");
        let mut session = [0u8; 16];
        session[..8].copy_from_slice(&h1.to_le_bytes());
        session[8..].copy_from_slice(&h2.to_le_bytes());
        Id::from_session(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    const TORCH: &[(&str, &str)] = &[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_RUN_ID", "none"),
    ];

    #[test]
    fn ids_round_trip_and_are_unique() {
        let a = Id::new().unwrap();
        let b = Id::new().unwrap();
        assert_ne!(a, b);
        assert_eq!(Id::uninit(*a.internal()), a);
        assert_eq!(Id::from_bytes(&a.to_bytes()).unwrap(), a);
        assert_eq!(Id::from_hex(&a.to_hex()).unwrap(), a);
        assert!(a.socket_name().starts_with("purlin-") && a.socket_name().len() == 7 + 32);
        assert!(Id::from_bytes(&[0u8; ID_BYTES]).is_err(), "an NCCL-like id without our magic");
        assert!(Id::from_bytes(&[0u8; 3]).is_err());
        assert!(Id::from_hex("zz").is_err());
        assert_ne!(a.derive(0), a);
        assert_ne!(a.derive(0), a.derive(1));
        assert_eq!(a.derive(7), Id::uninit(*a.internal()).derive(7));
        a.derive(3).check().unwrap();
    }

    #[test]
    fn torchrun_environment_parses() {
        let e = TorchEnv::from_lookup(env(TORCH)).unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank, e.master_port), (1, 2, 1, 29500));
        assert_eq!(e.run_id.as_deref(), Some("none"));
        // Every rank derives the same id; a different job, port or sequence number does not.
        let mut other_rank = TORCH.to_vec();
        other_rank[0] = ("RANK", "0");
        other_rank[2] = ("LOCAL_RANK", "0");
        let e0 = TorchEnv::from_lookup(env(&other_rank)).unwrap();
        assert_eq!(e.id(0), e0.id(0));
        assert_ne!(e.id(0), e.id(1));
        let mut other_port = TORCH.to_vec();
        other_port[5] = ("MASTER_PORT", "29501");
        assert_ne!(TorchEnv::from_lookup(env(&other_port)).unwrap().id(0), e.id(0));
        e.id(0).check().unwrap();
        assert_eq!(e.device_ordinal(2).unwrap(), 1);
        assert_eq!(e.device_ordinal(1).unwrap(), 0);
        assert!(e.device_ordinal(0).is_err());
        let mut four = TORCH.to_vec();
        four[2] = ("LOCAL_RANK", "5");
        four[1] = ("WORLD_SIZE", "8");
        four[3] = ("LOCAL_WORLD_SIZE", "8");
        assert!(TorchEnv::from_lookup(env(&four)).unwrap().device_ordinal(4).is_err());
    }

    #[test]
    fn bad_torchrun_environments_get_typed_errors() {
        let missing = |var: &str| TORCH.iter().copied().filter(|(k, _)| *k != var).collect::<Vec<_>>();
        for var in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"] {
            let err = TorchEnv::from_lookup(env(&missing(var))).unwrap_err();
            assert!(matches!(&err, Error::Env { var: v, .. } if *v == var), "{var}: {err}");
        }
        let mut bad = TORCH.to_vec();
        bad[0] = ("RANK", "two");
        assert!(matches!(TorchEnv::from_lookup(env(&bad)), Err(Error::Env { var: "RANK", .. })));
        bad[0] = ("RANK", "2");
        assert!(matches!(TorchEnv::from_lookup(env(&bad)), Err(Error::Env { var: "RANK", .. })));
        // A world across nodes parses; a single-node communicator refuses it, naming the way.
        let mut multi_node = TORCH.to_vec();
        multi_node[3] = ("LOCAL_WORLD_SIZE", "1");
        let across = TorchEnv::from_lookup(env(&multi_node)).unwrap();
        assert_eq!(across.local_world_size, 1);
        assert!(matches!(across.check_one_node(), Err(Error::Unsupported(m)) if m.contains("HierComm::from_env")));
        TorchEnv::from_lookup(env(TORCH)).unwrap().check_one_node().unwrap();
        let unset: Vec<_> = TORCH.iter().copied().filter(|(k, _)| *k != "LOCAL_WORLD_SIZE").collect();
        assert_eq!(TorchEnv::from_lookup(env(&unset)).unwrap().local_world_size, 2, "unset: one node");
        for bad in ["0", "3", "two"] {
            multi_node[3] = ("LOCAL_WORLD_SIZE", bad);
            assert!(
                matches!(TorchEnv::from_lookup(env(&multi_node)), Err(Error::Env { var: "LOCAL_WORLD_SIZE", .. })),
                "{bad}"
            );
        }
    }
}
