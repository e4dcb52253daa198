"""A real HTTP server answering from a thread for the length of one test."""

import contextlib
import threading


@contextlib.contextmanager
def serving(server):
    with server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server
        finally:
            server.shutdown()
            thread.join()
