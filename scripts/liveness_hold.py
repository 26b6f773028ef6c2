# Hold N idle TCP connections open to each given ip:port; reopen any the server closes.
import socket, selectors, sys, time, signal
n = int(sys.argv[1]); targets = [(a.rsplit(':',1)[0], int(a.rsplit(':',1)[1])) for a in sys.argv[2:]]
sel = selectors.DefaultSelector(); want = []; reopened = 0
def open_one(t):
    s = socket.socket(); s.setblocking(False)
    try: s.connect(t)
    except BlockingIOError: pass
    except OSError: s.close(); want.append(t); return
    sel.register(s, selectors.EVENT_READ, t)
for t in targets:
    for _ in range(n): open_one(t)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print("holding", n, "x", len(targets), flush=True)
while True:
    for key, _ in sel.select(timeout=0.05):
        s = key.fileobj
        try: d = s.recv(4096)
        except OSError: d = b''
        if not d:
            sel.unregister(s); s.close(); want.append(key.data)
    if want:
        time.sleep(0.05); w = want[:]; want.clear(); reopened += len(w)
        for t in w: open_one(t)
