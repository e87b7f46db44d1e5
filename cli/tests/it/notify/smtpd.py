"""A real SMTP server for knob's notification tests (cli/tests/it/notify.rs): aiosmtpd on
127.0.0.1, on a port the OS picks, printed as `PORT <n>` once it listens.

    smtpd.py OUT_DIR [--user U --password P] [--cert CERT --key KEY]

Each message received is written to OUT_DIR/mail-<n>.eml (envelope sender and recipients as
`X-Envelope-*` lines first), by a rename, so that a reader never sees half a file. Every AUTH
attempt is appended to OUT_DIR/auth.log as `<user> ok|refused`. With --user, AUTH is required;
with --cert, STARTTLS is offered and required before AUTH or MAIL.
"""

import argparse
import asyncio
import os
import socket
import ssl
import sys

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword


class Saver:
    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.count = 0

    async def handle_DATA(self, server, session, envelope):
        self.count += 1
        path = os.path.join(self.out_dir, f"mail-{self.count}.eml")
        head = f"X-Envelope-From: {envelope.mail_from}\nX-Envelope-To: {', '.join(envelope.rcpt_tos)}\n"
        with open(path + ".part", "wb") as out:
            out.write(head.encode() + envelope.original_content)
        os.rename(path + ".part", path)
        return "250 OK"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--user")
    parser.add_argument("--password")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args()

    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login.decode() == args.user
            and auth_data.password.decode() == args.password
        )
        login = auth_data.login.decode() if isinstance(auth_data, LoginPassword) else "?"
        with open(os.path.join(args.out_dir, "auth.log"), "a") as log:
            log.write(f"{login} {'ok' if ok else 'refused'}\n")
        return AuthResult(success=ok, handled=False)

    tls_context = None
    if args.cert:
        tls_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls_context.load_cert_chain(args.cert, args.key)

    saver = Saver(args.out_dir)

    def factory():
        return SMTP(
            saver,
            hostname="knob-test-smtpd",
            tls_context=tls_context,
            require_starttls=tls_context is not None,
            authenticator=authenticator if args.user else None,
            auth_required=bool(args.user),
            auth_require_tls=tls_context is not None,
        )

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(factory, sock=sock))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    # Ends when the test closes our stdin (or kills us).
    loop.add_reader(sys.stdin.fileno(), loop.stop)
    loop.run_forever()
    server.close()


if __name__ == "__main__":
    main()
