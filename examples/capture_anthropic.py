"""Saves the bodies of Anthropic Messages requests a harness sends, and
answers each with a one-word streamed reply, so the harness finishes.

    python3 examples/capture_anthropic.py PORT OUTDIR &
    ANTHROPIC_BASE_URL=http://127.0.0.1:PORT ANTHROPIC_API_KEY=x IS_SANDBOX=1 \
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 claude -p "Say hello" --output-format json

writes OUTDIR/req1.json, req2.json, ... (the input of
`cargo run --release --example embedded_prefill -- OUTDIR/req1.json`).
"""
import http.server
import json
import os
import sys

PORT, OUT = int(sys.argv[1]), sys.argv[2]
os.makedirs(OUT, exist_ok=True)
count = [0]
EVENTS = [
    ("message_start", {"type": "message_start", "message": {
        "id": "msg_capture", "type": "message", "role": "assistant", "model": "capture",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 0}}}),
    ("content_block_start", {"type": "content_block_start", "index": 0,
                             "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": "hi"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta",
                       "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                       "usage": {"output_tokens": 1}}),
    ("message_stop", {"type": "message_stop"}),
]


class Capture(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        count[0] += 1
        with open(os.path.join(OUT, f"req{count[0]}.json"), "wb") as f:
            f.write(body)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for kind, data in EVENTS:
            self.wfile.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", PORT), Capture).serve_forever()
