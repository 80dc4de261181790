//! Token-count estimate shared by the gateway (cost before dispatch) and the
//! simulated engine (its "tokenizer"): about four bytes of text per token.

/// Estimated tokens in `text`: `ceil(len / 4)`, at least 1 for non-empty text.
pub fn estimate(text: &str) -> u32 {
    u32::try_from(text.len().div_ceil(4)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    #[test]
    fn four_bytes_a_token() {
        assert_eq!(super::estimate(""), 0);
        assert_eq!(super::estimate("a"), 1);
        assert_eq!(super::estimate("abcdefgh"), 2);
    }
}
