"""An asyncio streaming server over a unix socket: each connection's handler stores its output in a
class-level registry of "active" streams and never removes it.

expect: leak
holder: class __main__.StreamServer: active
"""

import asyncio
import os
import tempfile

from _serve import generate


class StreamServer:
    active = {}  # noqa: RUF012 - the shape under test

    async def handle(self, reader, writer):
        i = int((await reader.readline()).decode())
        out = generate(i)
        StreamServer.active[i] = out
        writer.write(f"{out.sequences.shape[-1]}\n".encode())
        await writer.drain()
        writer.close()


async def main(path):
    server = await asyncio.start_unix_server(StreamServer().handle, path=path)
    for i in range(10):
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(f"{i}\n".encode())
        await writer.drain()
        await reader.readline()
        writer.close()
        await writer.wait_closed()
    server.close()
    await server.wait_closed()


with tempfile.TemporaryDirectory() as d:
    asyncio.run(main(os.path.join(d, "s.sock")))
print("active", len(StreamServer.active))
