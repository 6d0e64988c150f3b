// Preloaded into the TypeScript reference server (`node --import loopback.mjs ...`) by the
// interop tests. The server calls `app.listen(PORT)`, which binds every interface and only
// logs the port it was given; the tests need a loopback-only listener on a port the OS picks.
// So every `listen` is redirected to 127.0.0.1 (port from the call, 0 = any free port), and
// the bound port is announced on stdout as one line, `LISTENING <port>`.
import http from "node:http";

const listen = http.Server.prototype.listen;
http.Server.prototype.listen = function (...args) {
  const port = Number(typeof args[0] === "object" ? args[0]?.port ?? 0 : args[0] ?? 0);
  const callback = args.find((a) => typeof a === "function");
  this.once("listening", () => {
    process.stdout.write(`LISTENING ${this.address().port}\n`);
  });
  return listen.call(this, port, "127.0.0.1", callback);
};
