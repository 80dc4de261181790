//! Lowercase hex, for digests shown to operators (the policy's hash,
//! placement's keys), and lists of `u64` as 16 digits each (the cluster's
//! shared prefix homes).

/// `bytes` as lowercase hex, two digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Each of `values` as 16 lowercase hex digits, most significant first.
pub fn encode_u64s(values: &[u64]) -> String {
    use std::fmt::Write;
    values
        .iter()
        .fold(String::with_capacity(values.len() * 16), |mut s, v| {
            let _ = write!(s, "{v:016x}");
            s
        })
}

/// The values [`encode_u64s`] wrote; `None` unless `text` is whole
/// groups of 16 hex digits.
pub fn decode_u64s(text: &str) -> Option<Vec<u64>> {
    if !text.len().is_multiple_of(16) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    text.as_bytes()
        .chunks_exact(16)
        .map(|c| u64::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_of_u64_are_read_back() {
        let v = [0, 1, u64::MAX, 0x0123_4567_89ab_cdef];
        assert_eq!(decode_u64s(&encode_u64s(&v)), Some(v.to_vec()));
        assert_eq!(decode_u64s(""), Some(Vec::new()));
        assert_eq!(decode_u64s("123"), None);
        assert_eq!(decode_u64s("000000000000000g"), None);
        assert_eq!(decode_u64s("+00000000000000f"), None);
    }
}
