//! Email alerts over SMTP (lettre): `none`, `starttls` or `tls`, certificates verified.

use lettre::message::{Mailbox, MultiPart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use super::Channel;
use super::message::Message;
use crate::config::{EmailConfig, SmtpSecurity};
use crate::lane::BoxFuture;

/// The email channel.
pub struct EmailChannel {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    to: Vec<Mailbox>,
}

impl EmailChannel {
    /// Sets up the SMTP transport; credentials come from the env vars the config names.
    pub fn new(
        config: &EmailConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<EmailChannel, String> {
        let smtp = &config.smtp;
        let tls = || -> Result<TlsParameters, String> {
            let mut builder = TlsParameters::builder(smtp.host.clone());
            if let Some(path) = &smtp.ca_file {
                let pem = std::fs::read(path)
                    .map_err(|err| format!("cannot read smtp.ca_file {}: {err}", path.display()))?;
                let cert = Certificate::from_pem(&pem).map_err(|err| {
                    format!(
                        "smtp.ca_file {} is not a PEM certificate: {err}",
                        path.display()
                    )
                })?;
                builder = builder.add_root_certificate(cert);
            }
            builder
                .build_rustls()
                .map_err(|err| format!("cannot set up TLS for {}: {err}", smtp.host))
        };
        let mut builder = match smtp.security {
            SmtpSecurity::None => {
                AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(smtp.host.clone())
            }
            SmtpSecurity::Starttls => {
                AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(smtp.host.clone())
                    .tls(Tls::Required(tls()?))
            }
            SmtpSecurity::Tls => {
                AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(smtp.host.clone())
                    .tls(Tls::Wrapper(tls()?))
            }
        }
        .port(smtp.port)
        .timeout(Some(smtp.timeout));
        match (&smtp.username_env, &smtp.password_env) {
            (Some(user_var), Some(pass_var)) => {
                let read = |var: &str| {
                    env(var).filter(|v| !v.is_empty()).ok_or_else(|| {
                        format!("email: env var {var} named in alerts.email.smtp is not set")
                    })
                };
                builder = builder.credentials(Credentials::new(read(user_var)?, read(pass_var)?));
            }
            (None, None) => {}
            _ => {
                return Err(
                    "email: set both smtp.username_env and smtp.password_env, or neither".into(),
                );
            }
        }
        let parse = |address: &str| {
            address
                .parse::<Mailbox>()
                .map_err(|err| format!("email: `{address}` is not an address: {err}"))
        };
        Ok(EmailChannel {
            transport: builder.build(),
            from: parse(&config.from)?,
            to: config
                .to
                .iter()
                .map(|a| parse(a))
                .collect::<Result<_, _>>()?,
        })
    }
}

impl Channel for EmailChannel {
    fn name(&self) -> &'static str {
        "email"
    }

    fn send<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let mut builder = lettre::Message::builder()
                .from(self.from.clone())
                .subject(message.subject.clone());
            for to in &self.to {
                builder = builder.to(to.clone());
            }
            let email = builder
                .multipart(MultiPart::alternative_plain_html(
                    message.text.clone(),
                    message.html.clone(),
                ))
                .map_err(|err| format!("cannot build the email: {err}"))?;
            self.transport
                .send(email)
                .await
                .map(|_| ())
                .map_err(|err| format!("SMTP: {err}"))
        })
    }
}
