"""A real SMTP server (aiosmtpd) on loopback: canary's alert tests and the quickstart's mailbox.

Prints its port on the first line of stdout, then writes each message it accepts to --out as
NNNN.eml (the message as received, for any mail reader) and NNNN.json (the envelope, whether
the session was encrypted and authenticated, the headers, and the decoded text and HTML parts).
Started by scripts/mailbox, which installs aiosmtpd.
"""

import argparse
import asyncio
import email
import email.policy
import json
import os
import socket
import ssl

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword


class Recorder:
    def __init__(self, out):
        self.out = out
        self.count = 0

    async def handle_DATA(self, server, session, envelope):
        self.count += 1
        message = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        parts = {}
        for part in message.walk():
            if part.get_content_maintype() == "text":
                parts[part.get_content_subtype()] = part.get_content()
        record = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "tls": session.ssl is not None,
            "login": session.auth_data.login.decode()
            if session.authenticated and isinstance(session.auth_data, LoginPassword)
            else None,
            "headers": {k: str(v) for k, v in message.items()},
            "content_type": message.get_content_type(),
            "text": parts.get("plain"),
            "html": parts.get("html"),
            "raw": envelope.original_content.decode("utf-8", "replace"),
        }
        base = os.path.join(self.out, "%04d" % self.count)
        with open(base + ".eml.tmp", "wb") as f:
            f.write(envelope.original_content)
        os.rename(base + ".eml.tmp", base + ".eml")
        with open(base + ".json.tmp", "w") as f:
            json.dump(record, f)
        os.rename(base + ".json.tmp", base + ".json")
        return "250 Message accepted for delivery"


def authenticator(user, password):
    def check(server, session, envelope, mechanism, auth_data):
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == user.encode()
            and auth_data.password == password.encode()
        )
        return AuthResult(success=ok, handled=False, auth_data=auth_data)

    return check


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--user")
    parser.add_argument("--password")
    args = parser.parse_args()

    context = None
    if args.cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.cert, args.key)
    recorder = Recorder(args.out)

    def factory():
        return SMTP(
            recorder,
            hostname="localhost",
            tls_context=context,
            require_starttls=context is not None,
            authenticator=authenticator(args.user, args.password) if args.user else None,
            auth_required=args.user is not None,
            auth_require_tls=context is not None,
        )

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen()
    server = await asyncio.get_running_loop().create_server(factory, sock=sock)
    print(sock.getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
