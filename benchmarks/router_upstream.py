"""The upstream of benchmarks/router_overhead.py: it streams like vLLM's API server (FastAPI and
uvicorn with uvloop, as in the engine image, which runs it) without an engine: an empty role chunk
at once, then eight tokens $TOKEN_MS apart. Not imported by kit."""

import asyncio
import json
import os

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

app = FastAPI()
STEP = float(os.environ["TOKEN_MS"]) / 1000


@app.get("/health")
async def health():
    return JSONResponse({})


@app.get("/v1/models")
async def models():
    return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})


@app.post("/v1/chat/completions")
async def chat():
    async def chunks():
        yield 'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
        for i in range(8):
            await asyncio.sleep(STEP)
            yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}) + "\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")
