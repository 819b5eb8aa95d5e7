//! A server on 127.0.0.1:0 running on a thread of its own, so its work is never queued behind
//! the measured client's tasks (nor counted in its buffers).

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpStream;

/// Starts the thread `name`, accepting connections and handing each to `connection`.
pub fn serve_on_thread<F, Fut>(name: &str, connection: F) -> anyhow::Result<SocketAddr>
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let label = name.to_string();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => listener,
                    Err(err) => return eprintln!("{label}: loopback server: {err}"),
                };
                while let Ok((socket, _)) = listener.accept().await {
                    tokio::spawn(connection(socket));
                }
            });
        })?;
    Ok(addr)
}
