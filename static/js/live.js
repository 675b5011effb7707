// The live socket at /ws/live/ (protocol: console/live/consumers.py): subscribe to groups, report the
// connection state, reconnect by itself with backoff, and stop for good on close code 4401 (login required).

const CLOSE_UNAUTHENTICATED = 4401;
const FIRST_DELAY_MS = 500;
const MAX_DELAY_MS = 10000;
// A socket that opened but was never subscribed (the server's channel layer stalled, e.g. across a Redis
// restart) is closed and opened again rather than left looking connected.
const SUBSCRIBE_TIMEOUT_MS = 5000;

// statusElement's text is "live" while subscribed and "reconnecting" otherwise ("logged out" after 4401);
// its data-state says the same for styling. onSubscribed runs after every (re)subscribe: fetch the gap there.
export function connectLive({ groups, statusElement, onSubscribed, onMessage }) {
  let socket = null;
  let delay = FIRST_DELAY_MS;

  const setState = (state, text) => {
    statusElement.dataset.state = state;
    statusElement.textContent = text;
  };

  const send = (payload) => {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify(payload));
      return true;
    }
    return false;
  };

  const open = () => {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const opened = new WebSocket(`${scheme}://${location.host}/ws/live/`);
    socket = opened;
    let watchdog = null;
    opened.onopen = () => {
      send({ action: "subscribe", groups });
      watchdog = setTimeout(() => opened.close(), SUBSCRIBE_TIMEOUT_MS);
    };
    opened.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "subscribed") {
        clearTimeout(watchdog);
        delay = FIRST_DELAY_MS;
        setState("live", "live");
        onSubscribed();
      } else {
        onMessage(message);
      }
    };
    opened.onclose = (event) => {
      clearTimeout(watchdog);
      if (event.code === CLOSE_UNAUTHENTICATED) {
        setState("closed", "logged out");
        return;
      }
      setState("reconnecting", "reconnecting");
      // Jittered, doubling delay: many pages reconnecting after a restart do not arrive all at once.
      setTimeout(open, delay * (0.75 + Math.random() / 2));
      delay = Math.min(delay * 2, MAX_DELAY_MS);
    };
  };

  setState("reconnecting", "reconnecting");
  open();
  return { send };
}
