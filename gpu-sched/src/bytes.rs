//! Byte quantities as users write them (`10GiB`, `512mb`) and as reasons print them (`1.5 GiB`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::ByteSizeError;

/// A number of bytes: GPU memory, host memory.
///
/// Parsing accepts `B`, `K`/`KB`/`KiB`, `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB` in any
/// case, with or without a space, and decimals (`1.5GiB`). Every unit is binary (1 KB = 1024 B),
/// as in NNI's configs: a user who writes `trialGpuMemory: 10GB` means the 10 GiB that
/// `nvidia-smi` shows. Serialises as a plain byte count so JSON consumers need no parser;
/// deserialises from either a count or a string.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

impl ByteSize {
    pub const ZERO: ByteSize = ByteSize(0);

    pub const fn bytes(self) -> u64 {
        self.0
    }

    pub const fn kib(n: u64) -> ByteSize {
        ByteSize(n * KIB)
    }

    pub const fn mib(n: u64) -> ByteSize {
        ByteSize(n * MIB)
    }

    pub const fn gib(n: u64) -> ByteSize {
        ByteSize(n * GIB)
    }

    pub const fn tib(n: u64) -> ByteSize {
        ByteSize(n * TIB)
    }
}

impl fmt::Display for ByteSize {
    /// The largest binary unit that keeps the number at least 1, with at most one decimal:
    /// `80 GiB`, `1.5 GiB`, `512 MiB`, `17 B`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        let (unit_size, unit) = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")]
            .into_iter()
            .find(|&(size, _)| bytes >= size)
            .unwrap_or((1, "B"));
        if unit_size == 1 {
            return write!(f, "{bytes} B");
        }
        // Round to tenths in integer arithmetic so that 80 GiB minus a few bytes does not
        // print as "80.0 GiB" one moment and "79.9 GiB" the next.
        let tenths = (u128::from(bytes) * 10 + u128::from(unit_size) / 2) / u128::from(unit_size);
        if tenths % 10 == 0 {
            write!(f, "{} {unit}", tenths / 10)
        } else {
            write!(f, "{}.{} {unit}", tenths / 10, tenths % 10)
        }
    }
}

impl FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || ByteSizeError {
            text: text.to_owned(),
        };
        let trimmed = text.trim();
        let split = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let multiplier = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => KIB,
            "m" | "mb" | "mib" => MIB,
            "g" | "gb" | "gib" => GIB,
            "t" | "tb" | "tib" => TIB,
            _ => return Err(invalid()),
        };
        if number.is_empty() {
            return Err(invalid());
        }
        let bytes = match number.split_once('.') {
            None => number
                .parse::<u64>()
                .map_err(|_| invalid())?
                .checked_mul(multiplier),
            Some((whole, fraction)) => {
                // Exact decimal arithmetic: "0.1TiB" must not come out a byte short.
                if fraction.is_empty() || fraction.len() > 9 || fraction.contains('.') {
                    return Err(invalid());
                }
                let whole: u128 = if whole.is_empty() {
                    0
                } else {
                    whole.parse().map_err(|_| invalid())?
                };
                let scale = 10u128.pow(fraction.len() as u32);
                let fraction: u128 = fraction.parse().map_err(|_| invalid())?;
                let total = (whole * scale + fraction) * u128::from(multiplier) / scale;
                u64::try_from(total).ok()
            }
        };
        bytes.map(ByteSize).ok_or_else(invalid)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Count(u64),
            Text(String),
        }
        match Repr::deserialize(deserializer)? {
            Repr::Count(bytes) => Ok(ByteSize(bytes)),
            Repr::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}
