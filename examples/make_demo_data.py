"""Generate edgekit's own demo dataset: a phone assistant with 10 intents and slots.

Run `python examples/make_demo_data.py` to rewrite `examples/demo_intents.jsonl`. The output is
deterministic (seeded), so the committed file and a regenerated one are byte-identical.
Each line is `{"text", "intent", "slots": [{"start", "end", "slot"}]}` with character spans.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

FILLERS = {
    "time": ["7 am", "6:30", "noon", "half past eight", "9 pm", "midnight", "quarter to seven", "5:45 pm", "10 o'clock"],
    "date": ["tomorrow", "today", "on monday", "next friday", "this weekend", "on the 14th", "tonight", "on sunday"],
    "contact": ["mom", "dad", "alex", "priya", "the office", "dr. novak", "sam", "grandma", "jules", "my sister"],
    "message": ["i am running late", "see you at lunch", "call me back", "happy birthday", "on my way",
                "the meeting moved", "don't forget the keys", "dinner is ready"],
    "artist": ["queen", "miles davis", "taylor swift", "daft punk", "adele", "bts", "radiohead", "nina simone"],
    "song": ["bohemian rhapsody", "so what", "shake it off", "get lucky", "hello", "dynamite", "creep", "feeling good"],
    "app": ["spotify", "youtube music", "apple music", "deezer", "the radio app"],
    "city": ["berlin", "paris", "new york", "tokyo", "lagos", "são paulo", "mumbai", "oslo", "cape town", "seattle"],
    "duration": ["5 minutes", "ten minutes", "an hour", "30 seconds", "two hours", "90 seconds", "half an hour"],
    "destination": ["the airport", "work", "home", "the nearest pharmacy", "central station", "the gym",
                    "42 baker street", "the museum"],
    "transport": ["by car", "on foot", "by bike", "by train", "by bus"],
    "reminder": ["buy milk", "water the plants", "pay rent", "take my pills", "call the bank", "pick up laundry",
                 "book a dentist appointment", "renew my passport"],
    "setting": ["wifi", "bluetooth", "flashlight", "do not disturb", "airplane mode", "dark mode", "location"],
    "state": ["on", "off"],
    "event": ["meetings", "appointments", "events", "plans"],
}

TEMPLATES = {
    "set_alarm": ["set an alarm for {time}", "wake me up at {time}", "wake me up {date} at {time}",
                  "alarm for {time} {date}", "please set an alarm at {time}", "i need an alarm for {time}",
                  "can you wake me at {time} {date}"],
    "set_timer": ["set a timer for {duration}", "start a {duration} timer", "timer {duration}",
                  "count down {duration}", "remind me in {duration}", "can you time {duration} for me"],
    "send_message": ["text {contact} {message}", "send a message to {contact} saying {message}",
                     "tell {contact} that {message}", "message {contact} {message}",
                     "send {contact} a text {message}", "write to {contact} {message}"],
    "call_contact": ["call {contact}", "phone {contact}", "give {contact} a ring", "dial {contact} please",
                     "start a video call with {contact}", "can you call {contact}", "ring {contact}"],
    "play_music": ["play {song} by {artist}", "play some {artist}", "put on {artist} on {app}",
                   "i want to hear {song}", "play {song} on {app}", "shuffle {artist}", "listen to {artist}"],
    "get_weather": ["what's the weather in {city}", "weather {date}", "will it rain in {city} {date}",
                    "how cold is it in {city}", "do i need an umbrella {date}", "forecast for {city} {date}",
                    "is it sunny in {city}"],
    "navigate": ["take me to {destination}", "directions to {destination}", "navigate to {destination} {transport}",
                 "how do i get to {destination}", "route to {destination} {transport}",
                 "how long to {destination} {transport}"],
    "create_reminder": ["remind me to {reminder}", "remind me to {reminder} {date}",
                        "remind me {date} at {time} to {reminder}", "don't let me forget to {reminder}",
                        "add a reminder to {reminder}", "set a reminder {date} to {reminder}"],
    "toggle_setting": ["turn {state} {setting}", "switch {setting} {state}", "turn the {setting} {state}",
                       "can you turn {state} {setting}", "{setting} {state} please", "disable {setting}",
                       "enable {setting}"],
    "check_calendar": ["what's on my calendar {date}", "do i have any {event} {date}", "show my {event} {date}",
                       "am i free {date} at {time}", "what {event} do i have {date}", "read my agenda for {date}"],
}

FIELD = re.compile(r"\{(\w+)\}")


def render(template: str, rng: random.Random) -> dict:
    """Fill one template; return the text and the character span of each filled slot."""
    text, slots, pos = "", [], 0
    for m in FIELD.finditer(template):
        text += template[pos:m.start()]
        value = rng.choice(FILLERS[m.group(1)])
        slots.append({"start": len(text), "end": len(text) + len(value), "slot": m.group(1)})
        text += value
        pos = m.end()
    text += template[pos:]
    return {"text": text, "slots": slots}


def main(per_intent: int = 60, seed: int = 13) -> None:
    rng = random.Random(seed)
    rows, seen = [], set()
    for intent, templates in TEMPLATES.items():
        n, tries = 0, 0
        while n < per_intent and tries < per_intent * 50:
            tries += 1
            row = render(rng.choice(templates), rng)
            if row["text"] in seen:
                continue
            seen.add(row["text"])
            rows.append({"text": row["text"], "intent": intent, "slots": row["slots"]})
            n += 1
    rng.shuffle(rows)
    out = Path(__file__).with_name("demo_intents.jsonl")
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} utterances, {len(TEMPLATES)} intents to {out}")


if __name__ == "__main__":
    main()
