//! Bincode v2 (de)serialization of a call's plans.

use super::Plan;

/// Why serialized plans could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("encoding plans: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("decoding plans: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("{0} trailing bytes after the plans")]
    Trailing(usize),
}

/// Serializes a call's plans (one per rank) with bincode v2 (standard configuration).
pub fn encode_plans(plans: &[Plan]) -> Result<Vec<u8>, CodecError> {
    Ok(bincode::serde::encode_to_vec(plans, bincode::config::standard())?)
}

/// Reads plans written by [`encode_plans`].
pub fn decode_plans(bytes: &[u8]) -> Result<Vec<Plan>, CodecError> {
    let (plans, used): (Vec<Plan>, usize) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())?;
    if used != bytes.len() {
        return Err(CodecError::Trailing(bytes.len() - used));
    }
    Ok(plans)
}
