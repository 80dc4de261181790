//! An audio upload's `multipart/form-data` body (RFC 7578), read as it
//! arrives: the boundary, the incremental [`Form`] reader that keeps only
//! what routing needs, and the audio's duration from what it kept.

use http::header;
use memchr::memmem;

use super::{ASSUMED_BYTES_PER_SECOND, UNKNOWN_SECONDS};

/// The longest part header block, and the longest `model` value.
const HEADER_LIMIT: usize = 8 << 10;
const VALUE_LIMIT: usize = 1 << 10;
/// File bytes kept to sniff the format (a WAV header is 44).
const FILE_HEAD: usize = 64;

/// The boundary of a `multipart/form-data` request, from its headers.
pub fn boundary(headers: &http::HeaderMap) -> Option<&str> {
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    boundary_of(content_type)
}

/// The boundary of a `multipart/form-data` content type.
fn boundary_of(content_type: &str) -> Option<&str> {
    let mut params = content_type.split(';');
    let kind = params.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"'))
            .filter(|b| !b.is_empty() && b.len() <= 70)
    })
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    /// In a part's content (or the preamble), looking for a delimiter.
    Content,
    /// Just past a delimiter: `--` ends the form, a line break starts a part.
    AfterDelimiter,
    Headers,
    End,
}

#[derive(Debug)]
enum Part {
    Preamble,
    /// A text field that matters here (`model`, `stream`), its value so far.
    Field(&'static str, Vec<u8>),
    Other,
    File,
}

/// An incremental reader of a `multipart/form-data` body (RFC 7578) that
/// keeps only what routing needs: the `model` and `stream` fields and the
/// file's first bytes, size and position.
/// Why a multipart form cannot be read: the client's fault, and the same
/// body fails again. Its message is the one the client reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormError {
    /// A part's headers run past [`HEADER_LIMIT`].
    #[error("a multipart part's headers are too long")]
    HeadersTooLong,
    /// A field read for routing (`model`, `stream`) runs past its limit.
    #[error("the form field `{0}` is too long")]
    FieldTooLong(&'static str),
}

#[derive(Debug)]
pub struct Form {
    delimiter: Vec<u8>,
    buf: Vec<u8>,
    state: State,
    part: Part,
    /// Bytes fed so far.
    fed: u64,
    pub model: Option<String>,
    pub stream: bool,
    /// A later `model` field gave another value.
    pub conflicting_model: bool,
    /// Where the file's content starts in the body.
    file_start: Option<u64>,
    file_head: Vec<u8>,
    file_bytes: u64,
    file_complete: bool,
}

impl Form {
    pub fn new(boundary: &str) -> Form {
        Form {
            delimiter: format!("\r\n--{boundary}").into_bytes(),
            // The first delimiter has no line break before it: supply one.
            buf: b"\r\n".to_vec(),
            state: State::Content,
            part: Part::Preamble,
            fed: 0,
            model: None,
            stream: false,
            conflicting_model: false,
            file_start: None,
            file_head: Vec::new(),
            file_bytes: 0,
            file_complete: false,
        }
    }

    /// Bytes held back: a possible delimiter, or unfinished part headers.
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// True once routing has what it needs: the model and the file's head,
    /// or the end of the form.
    pub fn has_enough(&self) -> bool {
        self.state == State::End
            || (self.model.is_some()
                && self.file_start.is_some()
                && (self.file_head.len() >= FILE_HEAD || self.file_complete))
    }

    /// Reads the next bytes of the body.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), FormError> {
        self.fed += chunk.len() as u64;
        if self.state == State::End {
            return Ok(());
        }
        self.buf.extend_from_slice(chunk);
        loop {
            match self.state {
                State::Content => {
                    let Some(at) = memmem::find(&self.buf, &self.delimiter) else {
                        // Keep what could be the start of a delimiter.
                        let keep = self.delimiter.len() - 1;
                        if self.buf.len() > keep {
                            let n = self.buf.len() - keep;
                            self.content(n)?;
                            self.buf.drain(..n);
                        }
                        return Ok(());
                    };
                    self.content(at)?;
                    self.buf.drain(..at + self.delimiter.len());
                    self.end_part();
                    self.state = State::AfterDelimiter;
                }
                State::AfterDelimiter => {
                    if self.buf.len() < 2 {
                        return Ok(());
                    }
                    if self.buf.starts_with(b"--") {
                        self.state = State::End;
                        self.buf = Vec::new();
                        return Ok(());
                    }
                    // Transport padding, then a line break.
                    let eol = memmem::find(&self.buf, b"\r\n");
                    self.bounded(eol, 2)?;
                    let Some(eol) = eol else {
                        return Ok(());
                    };
                    self.buf.drain(..eol + 2);
                    self.state = State::Headers;
                }
                State::Headers => {
                    let end = if self.buf.starts_with(b"\r\n") {
                        Some((0, 2))
                    } else {
                        memmem::find(&self.buf, b"\r\n\r\n").map(|i| (i, i + 4))
                    };
                    self.bounded(end.map(|(i, _)| i), 4)?;
                    let Some((end, skip)) = end else {
                        return Ok(());
                    };
                    self.part = part_kind(&self.buf[..end]);
                    self.buf.drain(..skip);
                    if matches!(self.part, Part::File) && self.file_start.is_none() {
                        self.file_start = Some(self.fed - self.buf.len() as u64);
                    }
                    self.state = State::Content;
                }
                State::End => return Ok(()),
            }
        }
    }

    /// Headers end within [`HEADER_LIMIT`]: at `found`, or (not found yet)
    /// not before the end of `buf` less a partial terminator of `len`
    /// bytes. Judged by position, so the answer does not depend on how the
    /// body was cut into chunks.
    fn bounded(&self, found: Option<usize>, len: usize) -> Result<(), FormError> {
        let earliest = found.unwrap_or_else(|| (self.buf.len() + 1).saturating_sub(len));
        if earliest > HEADER_LIMIT {
            return Err(FormError::HeadersTooLong);
        }
        Ok(())
    }

    /// The first `n` bytes of `buf` belong to the current part.
    fn content(&mut self, n: usize) -> Result<(), FormError> {
        let bytes = &self.buf[..n];
        match &mut self.part {
            Part::Preamble | Part::Other => {}
            Part::Field(name, value) => {
                if value.len() + n > VALUE_LIMIT {
                    return Err(FormError::FieldTooLong(name));
                }
                value.extend_from_slice(bytes);
            }
            Part::File if !self.file_complete => {
                self.file_bytes += n as u64;
                let room = FILE_HEAD.saturating_sub(self.file_head.len()).min(n);
                self.file_head.extend_from_slice(&bytes[..room]);
            }
            // A second file is sent on but not read.
            Part::File => {}
        }
        Ok(())
    }

    fn end_part(&mut self) {
        match std::mem::replace(&mut self.part, Part::Other) {
            Part::Field(name, value) => {
                let value = String::from_utf8_lossy(&value).trim().to_owned();
                match name {
                    "model" => match &self.model {
                        None => self.model = Some(value),
                        Some(first) => self.conflicting_model |= *first != value,
                    },
                    _ => self.stream = value.eq_ignore_ascii_case("true") || value == "1",
                }
            }
            Part::File => self.file_complete = true,
            Part::Preamble | Part::Other => {}
        }
    }

    /// The audio's estimated duration in seconds, given the body's declared
    /// length.
    pub fn seconds(&self, content_length: Option<u64>) -> f64 {
        let Some(start) = self.file_start else {
            return 0.0;
        };
        let size = if self.file_complete {
            self.file_bytes
        } else if let Some(len) = content_length {
            len.saturating_sub(start)
        } else {
            return UNKNOWN_SECONDS;
        };
        match wav_byte_rate(&self.file_head) {
            // A header may declare a rate far below any speech audio's
            // (1 Hz): the duration is no more than the bytes hold at
            // the lowest rate Whisper is fed (8 kHz, 8-bit mono).
            Some(rate) => size.saturating_sub(44) as f64 / f64::from(rate.max(MIN_WAV_BYTE_RATE)),
            None => size as f64 / ASSUMED_BYTES_PER_SECOND as f64,
        }
    }
}

/// What a part is, from its headers: the file (a part with a file name),
/// a field read here, or another field.
fn part_kind(headers: &[u8]) -> Part {
    let headers = String::from_utf8_lossy(headers);
    let Some(disposition) = headers.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-disposition")
            .then_some(value)
    }) else {
        return Part::Other;
    };
    let mut name = None;
    let mut file = false;
    for param in disposition.split(';').skip(1) {
        let Some((k, v)) = param.split_once('=') else {
            continue;
        };
        match k.trim().to_ascii_lowercase().as_str() {
            "name" => name = Some(v.trim().trim_matches('"').to_owned()),
            "filename" | "filename*" => file = true,
            _ => {}
        }
    }
    match name.as_deref() {
        _ if file => Part::File,
        Some("model") => Part::Field("model", Vec::new()),
        Some("stream") => Part::Field("stream", Vec::new()),
        _ => Part::Other,
    }
}

/// The lowest byte rate a WAV is charged at: 8 kHz, 8-bit mono (telephone
/// audio, the least any speech recognizer is fed).
const MIN_WAV_BYTE_RATE: u32 = 8_000;

/// A canonical RIFF/WAVE header's byte rate: its `fmt ` chunk first,
/// with a byte rate that agrees with its sample rate and block size (so a
/// client cannot name any rate it likes; another layout is sized as a
/// compressed file, and the usage settles it either way).
fn wav_byte_rate(head: &[u8]) -> Option<u32> {
    if head.len() < 44 || &head[..4] != b"RIFF" || &head[8..16] != b"WAVEfmt " {
        return None;
    }
    let u32_at = |i: usize| Some(u32::from_le_bytes(head.get(i..i + 4)?.try_into().ok()?));
    let u16_at = |i: usize| Some(u16::from_le_bytes(head.get(i..i + 2)?.try_into().ok()?));
    let (channels, sample_rate, byte_rate) = (u16_at(22)?, u32_at(24)?, u32_at(28)?);
    let (block_align, bits) = (u16_at(32)?, u16_at(34)?);
    let consistent = byte_rate > 0
        && u64::from(block_align) == u64::from(channels) * u64::from(bits).div_ceil(8)
        && u64::from(byte_rate) == u64::from(sample_rate) * u64::from(block_align);
    consistent.then_some(byte_rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(fields: &[(&str, &[u8])], file_name: Option<&str>) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in fields {
            out.extend_from_slice(b"--XyZ\r\nContent-Disposition: form-data; name=\"");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\"");
            if *name == "file" {
                let f = file_name.unwrap_or("a.mp3");
                out.extend_from_slice(
                    format!("; filename=\"{f}\"\r\nContent-Type: audio/mpeg").as_bytes(),
                );
            }
            out.extend_from_slice(b"\r\n\r\n");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"--XyZ--\r\n");
        out
    }

    fn wav(seconds: u32) -> Vec<u8> {
        let rate = 32_000u32; // 16 kHz, 16-bit mono
        let data = rate * seconds;
        let mut h = Vec::new();
        h.extend_from_slice(b"RIFF");
        h.extend_from_slice(&(36 + data).to_le_bytes());
        h.extend_from_slice(b"WAVEfmt ");
        h.extend_from_slice(&16u32.to_le_bytes());
        h.extend_from_slice(&1u16.to_le_bytes());
        h.extend_from_slice(&1u16.to_le_bytes());
        h.extend_from_slice(&16_000u32.to_le_bytes());
        h.extend_from_slice(&rate.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&16u16.to_le_bytes());
        h.extend_from_slice(b"data");
        h.extend_from_slice(&data.to_le_bytes());
        h.resize(44 + data as usize, 0);
        h
    }

    /// Feeds `body` in pieces of `step` bytes, as a network would.
    fn read(body: &[u8], step: usize) -> Form {
        let mut f = Form::new("XyZ");
        for piece in body.chunks(step) {
            f.feed(piece).unwrap();
        }
        f
    }

    #[test]
    fn reads_fields_before_and_after_the_file_in_any_chunking() {
        let audio = vec![7u8; 48_000];
        let first = form(
            &[("model", b"whisper"), ("stream", b"true"), ("file", &audio)],
            None,
        );
        let last = form(
            &[
                ("file", &audio),
                ("model", b" whisper "),
                ("language", b"en"),
            ],
            None,
        );
        for body in [&first, &last] {
            for step in [1, 2, 7, 64, 1000, body.len()] {
                let f = read(body, step);
                assert_eq!(f.model.as_deref(), Some("whisper"), "step {step}");
                assert!(f.has_enough());
                assert!(
                    (f.seconds(None) - 3.0).abs() < 1e-9,
                    "step {step}: {}",
                    f.seconds(None)
                );
            }
        }
        assert!(read(&first, 5).stream);
        assert!(!read(&last, 5).stream);
    }

    #[test]
    fn has_enough_as_soon_as_the_model_and_the_files_head_are_read() {
        let audio = vec![1u8; 1 << 20];
        let body = form(&[("model", b"whisper"), ("file", &audio)], None);
        let mut f = Form::new("XyZ");
        let mut fed = 0;
        for piece in body.chunks(100) {
            f.feed(piece).unwrap();
            fed += piece.len();
            if f.has_enough() {
                break;
            }
        }
        assert!(fed < 400, "read {fed} bytes");
        // The rest of the size comes from the declared length.
        let secs = f.seconds(Some(body.len() as u64));
        assert!((secs - (1 << 20) as f64 / 16_000.0).abs() < 0.01, "{secs}");
        assert_eq!(f.seconds(None), UNKNOWN_SECONDS);
    }

    #[test]
    fn a_wav_header_gives_the_duration() {
        let body = form(&[("model", b"w"), ("file", &wav(7))], Some("a.wav"));
        let f = read(&body, 333);
        assert!((f.seconds(None) - 7.0).abs() < 1e-9);
        let mut partial = Form::new("XyZ");
        partial.feed(&body[..400]).unwrap();
        assert!(partial.has_enough());
        assert!((partial.seconds(Some(body.len() as u64)) - 7.0).abs() < 0.01);
    }

    #[test]
    fn a_boundary_inside_the_file_without_its_line_break_is_content() {
        let mut audio = b"--XyZ not a delimiter \r\n-XyZ".to_vec();
        audio.extend_from_slice(&[0u8; 100]);
        let body = form(&[("file", &audio), ("model", b"m")], None);
        let f = read(&body, 3);
        assert_eq!(f.model.as_deref(), Some("m"));
        assert_eq!(f.file_bytes, audio.len() as u64);
    }

    #[test]
    fn bad_forms_are_errors_or_lack_a_model() {
        let long = vec![b'm'; 5000];
        let body = form(&[("model", &long)], None);
        assert!(Form::new("XyZ").feed(&body).is_err());
        let mut f = Form::new("XyZ");
        let junk = vec![b'h'; HEADER_LIMIT + 10];
        let mut body = b"--XyZ\r\n".to_vec();
        body.extend_from_slice(&junk);
        assert!(f.feed(&body).is_err());
        let f = read(b"not a form at all", 4);
        assert!(f.model.is_none() && !f.has_enough());
    }

    #[test]
    fn a_second_model_with_another_value_is_a_conflict() {
        let audio = vec![3u8; 1000];
        let f = read(
            &form(&[("model", b"a"), ("file", &audio), ("model", b"b")], None),
            7,
        );
        assert!(f.conflicting_model);
        assert_eq!(f.model.as_deref(), Some("a"));
        let f = read(
            &form(&[("model", b"a"), ("file", &audio), ("model", b" a")], None),
            7,
        );
        assert!(!f.conflicting_model);
    }

    #[test]
    fn only_a_consistent_canonical_wav_header_sets_the_rate() {
        let mut w = wav(2);
        // A byte rate that disagrees with 16 kHz × 2 bytes.
        w[28..32].copy_from_slice(&1u32.to_le_bytes());
        let f = read(&form(&[("model", b"w"), ("file", &w)], Some("a.wav")), 100);
        let by_size = w.len() as f64 / ASSUMED_BYTES_PER_SECOND as f64;
        assert!((f.seconds(None) - by_size).abs() < 1e-9);
        // A chunk before `fmt `: not the canonical layout.
        let mut w = wav(2);
        w[12..16].copy_from_slice(b"JUNK");
        assert_eq!(wav_byte_rate(&w[..64]), None);
        assert_eq!(wav_byte_rate(&wav(2)[..64]), Some(32_000));
        // A consistent header at 1 Hz (8-bit mono): 32 KB would be 32,000
        // s; it is charged no more than the bytes hold at 8 kHz, 4 s.
        let mut w = wav(1);
        w[24..28].copy_from_slice(&1u32.to_le_bytes());
        w[28..32].copy_from_slice(&1u32.to_le_bytes());
        w[32..34].copy_from_slice(&1u16.to_le_bytes());
        w[34..36].copy_from_slice(&8u16.to_le_bytes());
        assert_eq!(wav_byte_rate(&w[..64]), Some(1));
        let f = read(&form(&[("model", b"w"), ("file", &w)], Some("a.wav")), 100);
        assert!(
            (f.seconds(None) - 32_000.0 / 8_000.0).abs() < 1e-9,
            "{}",
            f.seconds(None)
        );
    }

    #[test]
    fn boundaries_from_content_types() {
        assert_eq!(
            boundary_of("multipart/form-data; boundary=abc"),
            Some("abc")
        );
        assert_eq!(
            boundary_of("Multipart/Form-Data;boundary=\"a b\""),
            Some("a b")
        );
        assert_eq!(boundary_of("application/json"), None);
        assert_eq!(boundary_of("multipart/form-data"), None);
    }
}
