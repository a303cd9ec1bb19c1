//! Server-sent events as SGLang streams them: each chunk is an event of
//! `data: {json}` lines ended by a blank line, the last one `data: [DONE]`.
//! Bytes arrive cut anywhere; [`SseFramer`] reassembles events.

/// Reassembles `data:` payloads from arbitrary byte chunks.
#[derive(Debug, Default)]
pub struct SseFramer {
    buf: Vec<u8>,
}

/// The payload that ends a stream.
pub const DONE: &str = "[DONE]";

impl SseFramer {
    /// Adds bytes; returns the payloads of the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some((end, sep)) = find_blank_line(&self.buf) {
            let event: Vec<u8> = self.buf.drain(..end + sep).take(end).collect();
            let text = String::from_utf8(event).map_err(|_| "event is not UTF-8".to_string())?;
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                out.push(data.join("\n"));
            }
        }
        Ok(out)
    }

    /// Bytes of an event not yet ended.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// Where the first blank line starts and how long the separator is.
fn find_blank_line(b: &[u8]) -> Option<(usize, usize)> {
    (0..b.len()).find_map(|i| {
        if b[i..].starts_with(b"\n\n") {
            Some((i, 2))
        } else if b[i..].starts_with(b"\r\n\r\n") {
            Some((i, 4))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_cut_anywhere_reassemble() {
        let stream = b"data: {\"a\": 1}\n\n: comment\n\ndata: {\"b\": 2}\r\n\r\ndata: [DONE]\n\n";
        for cut in 1..stream.len() {
            let mut f = SseFramer::default();
            let mut got = f.push(&stream[..cut]).unwrap();
            got.extend(f.push(&stream[cut..]).unwrap());
            assert_eq!(got, vec!["{\"a\": 1}", "{\"b\": 2}", DONE], "cut at {cut}");
            assert_eq!(f.pending(), 0);
        }
    }
}
