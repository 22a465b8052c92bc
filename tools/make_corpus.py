"""Writes corpus.txt, the original training text for the built-in BPE tokenizer.

The text is assembled from hand-written word lists and templates with a fixed seed, so it is free of
third-party prose yet mixes narrative, explanations, dialogue, numbers, code, Chinese and emoji: enough
variety for merges that cover what a demo prompt contains. A build-time tool. Run: python tools/make_corpus.py
"""
from __future__ import annotations

import random
from pathlib import Path

NAMES = ["Mira", "Tomas", "Ada", "Kenji", "Lucia", "Omar", "Priya", "Jonas", "Elif", "Bruno", "Wen", "Sofia",
         "Ravi", "Noor", "Felix", "Hana", "Dmitri", "Aiko", "Marcus", "Leila"]
PLACES = ["the harbor", "the old library", "a quiet village", "the train station", "the market square",
          "the mountain cabin", "the riverbank", "the server room", "a crowded cafe", "the rooftop garden",
          "the night bus", "the museum basement", "a small bakery", "the lighthouse", "the workshop"]
OBJECTS = ["a brass key", "the map", "a tin of biscuits", "an umbrella", "the notebook", "a broken radio",
           "a jar of honey", "the lantern", "a stack of letters", "the compass", "a wool scarf", "the laptop",
           "a paper kite", "the violin", "a bag of oranges", "the spare battery"]
VERBS = ["found", "carried", "repaired", "forgot", "painted", "borrowed", "hid", "sold", "opened", "measured",
         "cleaned", "described", "photographed", "returned", "wrapped", "studied"]
ADJS = ["quiet", "bright", "stubborn", "curious", "tired", "careful", "cheerful", "patient", "restless",
        "clever", "gentle", "nervous", "proud", "honest", "sleepy", "brave"]
ADVS = ["slowly", "quickly", "carefully", "suddenly", "quietly", "happily", "reluctantly", "eagerly",
        "gently", "twice", "almost", "finally"]
TIMES = ["at dawn", "before lunch", "late in the evening", "on Tuesday", "after the storm", "in early spring",
         "during the holidays", "at half past nine", "last winter", "the next morning", "around midnight"]
WEATHER = ["rain", "fog", "snow", "wind", "sunshine", "thunder", "drizzle", "frost", "heat", "hail"]
TOPICS = {
    "cooking": (["onions", "garlic", "rice", "lentils", "butter", "flour", "tomatoes", "ginger", "eggs"],
                ["simmer", "stir", "chop", "roast", "knead", "whisk", "season", "taste", "fold"]),
    "gardening": (["seedlings", "compost", "tulips", "roots", "soil", "beans", "mint", "hedges", "weeds"],
                  ["water", "prune", "plant", "mulch", "harvest", "repot", "trim", "cover", "feed"]),
    "computing": (["caches", "threads", "packets", "queues", "pointers", "kernels", "buffers", "tensors",
                   "requests", "tokens"],
                  ["allocate", "schedule", "flush", "batch", "compile", "profile", "evict", "serialize",
                   "decode"]),
    "astronomy": (["comets", "nebulae", "moons", "galaxies", "asteroids", "planets", "pulsars", "stars"],
                  ["observe", "track", "measure", "photograph", "catalog", "map", "predict", "classify"]),
    "trains": (["carriages", "signals", "platforms", "timetables", "rails", "tickets", "engines"],
               ["inspect", "delay", "couple", "announce", "board", "switch", "repaint", "count"]),
    "music": (["chords", "melodies", "drums", "scales", "rhythms", "choirs", "strings", "songs"],
              ["rehearse", "tune", "compose", "record", "perform", "arrange", "transpose", "hum"]),
}
CONNECT = ["However,", "Meanwhile,", "In the end,", "Still,", "Because of that,", "Later,", "Oddly enough,",
           "As usual,", "For a while,", "Without a word,"]
ZH_SUBJ = ["我", "你", "他", "她", "我们", "老师", "我的朋友", "小王", "这个学生", "妈妈", "工程师", "孩子们"]
ZH_VERB = ["喜欢", "正在学习", "看见了", "买了", "需要", "想要", "写了", "打开了", "找到了", "讨论了"]
ZH_OBJ = ["一本新书", "中文", "这台电脑", "一杯热茶", "那座山", "今天的天气", "一个问题", "火车票", "音乐",
          "这个程序", "苹果", "一封信"]
ZH_TAIL = ["。", "，然后回家了。", "，觉得很有意思。", "吗？", "！", "，因为明天要考试。", "，但是没有时间。"]
ZH_EXTRA = ["今天天气很好，我们去公园散步吧。", "这个模型很小，但是可以用来测试。", "请问火车站怎么走？",
            "他每天早上六点起床。", "学习语言需要很多耐心。", "我们明天下午三点见面。", "你好，世界！"]
COMMON = ["time", "people", "year", "way", "day", "world", "life", "work", "system", "program", "question",
          "number", "model", "engine", "memory", "answer", "example", "story", "water", "city", "house",
          "friend", "language", "problem", "idea", "school", "company", "history", "result", "picture",
          "window", "morning", "reason", "student", "computer", "science", "country", "family", "letter"]
NOUNS = """apple bridge candle desert engine forest garden harbor island jacket kettle ladder market needle
ocean pencil quarter river saddle tunnel valley wallet yard zebra anchor basket cabinet dolphin elephant
feather glacier hammer insect journal kitchen lemon mirror napkin orchard pillow rabbit shadow thunder
umbrella village whistle blanket castle diamond envelope fountain guitar helmet iceberg jungle kingdom
lantern meadow notebook octopus parrot quilt rocket sandwich tiger volcano wizard airport balcony
camera doctor factory galaxy hospital library mountain painter question railway station teacher
uniform vehicle weekend answer border chapter climate colony courage crystal culture dinner energy
evidence festival freedom harvest holiday journey knowledge machine message minute moment neighbor
network opinion orange package parent pattern planet pocket poetry prison promise puzzle recipe record
region resource routine sample season secret signal silence society soldier spirit square stomach
student subject summer surface symbol theory ticket tomato tongue tourist traffic treasure triangle
trouble turtle victory visitor voice warning weather window winter wonder writer account address
advice agreement animal apartment argument article audience balance battery beach bicycle birthday
blood bottle branch breakfast budget building business butter button cable calendar canvas carpet
cattle ceiling century chicken circle clock cloud coffee collar comfort compass concert copper corner
cottage cotton county cousin cream crowd curtain customer danger daughter decade degree detail device
diagram distance dragon drawer driver eagle earth editor effort emperor error exercise family farmer
fence fever field finger flower folder friend furniture future glass government grammar grandmother
grass habit hallway harbor height highway history honey horizon hunger husband image industry
instrument invention iron jewel judge kernel kitten lake language lawyer leather lesson lizard
lobster luggage magnet manager marble meeting memory metal method middle midnight monkey morning
mother museum music nature needle nephew noise number office onion orbit oven owner oxygen palace
paper partner passenger peanut pepper picture pilot pirate plastic platform pleasure pocket potato
powder printer problem profit pumpkin puppy pyramid queen rainbow reason rhythm ribbon riddle rubber
salad scholar science scissors screen sculpture servant shelter shoulder sister skeleton slope
spider spoon statue stone storm stranger sugar sweater system table temple thread throat tissue
tower toy tractor tree umpire universe valve velvet vessel violin wagon water wheat wheel wire wolf
wood worker""".split()
PAST = """accepted admired allowed answered appeared argued arranged arrived asked attacked avoided baked
balanced banned behaved believed belonged boiled borrowed bounced breathed brought built burned
calculated called carried caught changed chased checked chewed chose cleaned climbed collected
compared complained completed confessed considered copied counted covered cracked crashed crawled
created crossed cried danced decided delivered described designed destroyed developed discovered
divided doubted dragged drank dreamed dressed dropped earned emptied encouraged enjoyed entered
escaped examined expected explained explored faded failed fastened fetched filled fixed floated
flowed folded followed forgave forgot found froze gathered gave glowed grabbed greeted grew guarded
guessed guided hammered handled hanged happened hated heard helped hid hoped hugged hummed hunted
hurried identified ignored imagined improved included increased informed injured inspected invented
invited joined joked judged jumped kept kicked killed kissed kneeled knew knocked labeled landed
laughed learned left lifted liked listened lived locked looked loved managed marched married matched
measured melted memorized mixed moved muttered nailed named needed noticed obeyed objected observed
obtained offered opened ordered owned packed painted parked passed paused performed permitted picked
placed planned planted played pleaded pointed polished poured practiced prayed preferred prepared
pressed pretended printed produced promised protected pulled punished pushed questioned raced rained
raised reached read realized received recorded reduced refused relaxed released remained remembered
reminded removed repaired repeated replaced replied reported rescued rested returned rinsed robbed
rolled rubbed ruled rushed sailed saved scattered scolded scratched screamed searched selected sent
served settled shared shivered shopped shouted showed signed sketched skipped slept slipped smiled
smelled sneezed solved sorted sparked spilled spoke spread squeezed stamped started stayed stepped
stirred stopped stored stretched struck studied succeeded suggested supplied supported surprised
surrounded suspected swam switched taught teased tested thanked threw tickled tied touched traced
traded trained transported trapped traveled treated trembled tricked tried trusted turned typed
understood unfolded unlocked unpacked used vanished visited waited walked wandered wanted warned
washed watched waved weighed welcomed whispered whistled wished wondered worked worried wrapped wrote
yawned yelled zipped""".split()
ADJ2 = """ancient angry awkward bitter blank bold brief broad broken busy calm careless cheap chilly clean
clumsy cold common complex cozy crisp cruel damp dark deep delicate dense distant dizzy dry dull eager
early easy elegant empty endless enormous exact faint fair famous fancy fierce filthy flat fluffy
foolish fragile free fresh friendly frozen funny fuzzy generous giant glossy golden graceful grateful
greasy great green grumpy handsome happy hard harsh healthy heavy helpful hidden hollow honest huge
humble hungry icy ideal idle immense important innocent jolly juicy kind large lazy legal light
little lively lonely loud lovely lucky magnificent massive mellow messy mighty modern narrow nasty
neat noisy normal odd old orange ordinary pale perfect plain pleasant plump polite poor powerful
precious pretty private purple quick rapid rare raw ready real rich rough round royal rude rusty sad
salty scary sharp shiny short shy silent silly simple skinny slim slippery smooth soft solid sore
sour spicy splendid steep sticky stiff strange strict strong sturdy sudden sweet swift tall tame
tender thick thin thirsty tight tiny tough tricky ugly unusual useful vague vast violent warm weak
wealthy weary wet white wide wild wise wooden worried yellow young zealous""".split()
ZH_WORDS = """学校 医院 银行 图书馆 公司 城市 农村 电影 朋友 家人 老人 医生 司机 厨师 记者 科学家 作家 画家 歌手
运动员 警察 商店 超市 饭馆 机场 码头 公园 河流 大海 森林 草原 沙漠 雪山 月亮 太阳 星星 云彩 雨水 风景 花园 果园
小狗 小猫 老虎 熊猫 鸟儿 鱼儿 马车 汽车 自行车 飞机 轮船 地铁 手机 相机 键盘 屏幕 软件 硬件 网络 数据 算法 模型
内存 缓存 程序员 服务器 数据库 文件 报告 会议 计划 问题 答案 方法 经验 历史 文化 艺术 音乐 舞蹈 诗歌 小说 故事
新闻 杂志 报纸 衣服 鞋子 帽子 桌子 椅子 窗户 门口 房间 厨房 早饭 午饭 晚饭 米饭 面条 饺子 包子 蔬菜 水果 牛奶
咖啡 茶叶 蛋糕 春天 夏天 秋天 冬天 早上 中午 晚上 周末 假期 生日 节日 礼物 照片 地图 钥匙 雨伞 钱包 行李""".split()
ZH_ADJ = """漂亮 安静 热闹 干净 便宜 昂贵 有趣 无聊 重要 简单 复杂 方便 舒服 可爱 聪明 勇敢 认真 快乐 难过 忙碌
轻松 奇怪 古老 现代 美丽 温暖 寒冷 新鲜 明亮 危险""".split()
ZH_ACT = """参观 准备 打扫 修理 介绍 讨论 学习 研究 保护 整理 检查 分享 等待 寻找 记录 描述 设计 测试 运行 下载""".split()
EMOJI = ["🙂", "🚀", "🌧️", "🍜", "🎵", "✨", "🔥", "📚", "🌱", "☕", "🐍", "👍", "🎉", "🧪", "🌙", "😅"]


def sentence(r: random.Random) -> str:
    """One narrative sentence from a random template."""
    n, p, o, v = r.choice(NAMES), r.choice(PLACES), r.choice(OBJECTS), r.choice(VERBS)
    a, adv, t = r.choice(ADJS), r.choice(ADVS), r.choice(TIMES)
    forms = [
        f"{n} {v} {o} near {p} {t}.",
        f"The {a} clerk at {p} {adv} {v} {o}.",
        f"{t.capitalize()}, {n} walked to {p} and {v} {o}.",
        f"Nobody expected {n} to be so {a} about {o}.",
        f"{n} and {r.choice(NAMES)} {adv} {v} {o} while the {r.choice(WEATHER)} kept falling.",
        f"If the {r.choice(WEATHER)} stops {t}, {n} will bring {o} to {p}.",
        f"{r.choice(CONNECT)} {n} {v} {o} and felt {a}.",
        f"Was it {o} that {n} {v}, or something else entirely?",
    ]
    return r.choice(forms)


def explain(r: random.Random) -> str:
    """A short expository paragraph about one topic."""
    topic = r.choice(list(TOPICS))
    nouns, verbs = TOPICS[topic]
    out = []
    for _ in range(r.randint(3, 6)):
        x, y, vb = r.choice(nouns), r.choice(nouns), r.choice(verbs)
        out.append(r.choice([
            f"When you {vb} the {x}, check the {y} first.",
            f"Most people {vb} {x} too early; waiting {r.randint(2, 40)} minutes usually helps.",
            f"It is easier to {vb} {x} than {y}, at least in {topic}.",
            f"A good rule in {topic}: never {vb} more {x} than you can watch.",
            f"Experts {vb} {x} in small groups of {r.randint(2, 12)}, then compare the {y}.",
            f"Why do the {x} matter so much? Because every step after them depends on the {y}.",
        ]))
    return " ".join(out)


def rich(r: random.Random) -> str:
    """A sentence over the large word lists, for vocabulary breadth."""
    n1, n2, n3 = r.sample(NOUNS, 3)
    a1, a2 = r.sample(ADJ2, 2)
    v1, v2 = r.sample(PAST, 2)
    who = r.choice(NAMES + ["The " + r.choice(NOUNS), "A " + a1 + " " + r.choice(NOUNS), "My " + n3])
    return r.choice([
        f"{who} {v1} the {a1} {n1} and then {v2} a {a2} {n2}.",
        f"Beside the {a1} {n1}, {who.lower() if who.startswith(('The', 'A ', 'My')) else who} "
        f"{v1} {r.choice(ADVS)}.",
        f"The {n1} was {a1}, the {n2} was {a2}, and nobody {v1} the {n3}.",
        f"{who} {v1} every {n1} in the {n2}, which seemed {a2} at the time.",
        f"Some {n1}s are {a1}; others are {a2} and {r.choice(ADJ2)}.",
    ])


def musing(r: random.Random) -> str:
    """General statements built from common words, so everyday prompts tokenize well."""
    a, b, c = r.sample(COMMON, 3)
    return r.choice([
        f"Every {a} has a {b}, but not every {b} has a {c}.",
        f"What would you change about the {a} if you had one more {b}?",
        f"I think the {a} is more important than the {b}; the {c} can wait.",
        f"They say a {a} without a {b} is like a {c} without a window.",
        f"Please explain the {a} to me as if I were a new {b}.",
        f"This {a} was written to test the {b}, not to win a prize for the {c}.",
        f"Here is a simple {a}: take one {b}, add a {c}, and see what happens.",
    ])


def dialogue(r: random.Random) -> str:
    a, b = r.sample(NAMES, 2)
    o, p = r.choice(OBJECTS), r.choice(PLACES)
    lines = [f'"Have you seen {o}?" asked {a}.',
             f'"I left it at {p}," {b} said, "{r.choice(TIMES)}."',
             f'"Are you sure? It\'s {r.choice(ADJS)} of you to remember."',
             f'{b} shrugged. "Mostly sure. Call me if it isn\'t there."']
    return "\n".join(lines[: r.randint(2, 4)])


def numbers(r: random.Random) -> str:
    y, mo, d = r.randint(1990, 2030), r.randint(1, 12), r.randint(1, 28)
    items = [
        f"On {y}-{mo:02d}-{d:02d} the shop sold {r.randint(3, 900)} items "
        f"for ${r.randint(1, 999)}.{r.randint(0, 99):02d}.",
        f"The trip took {r.randint(1, 23)}h {r.randint(0, 59)}m and covered {r.uniform(1, 500):.1f} km.",
        f"Version {r.randint(0, 4)}.{r.randint(0, 20)}.{r.randint(0, 9)} "
        f"is {r.randint(5, 95)}% faster than before.",
        f"Call 555-{r.randint(1000, 9999)} between {r.randint(8, 11)}:00 and {r.randint(1, 6)}:30 pm.",
        f"Step {r.randint(1, 9)} of {r.randint(10, 20)}: "
        f"set the oven to {r.choice([160, 180, 200, 220])} °C.",
        f"Throughput rose from {r.randint(100, 999)} to {r.randint(1000, 9999)} tokens/s "
        f"(p99 = {r.randint(10, 99)} ms).",
    ]
    return " ".join(r.sample(items, r.randint(1, 3)))


def code(r: random.Random) -> str:
    """A small snippet in one of several languages."""
    f = r.choice(["load", "count", "merge", "free", "parse", "next", "get", "make"]) + "_" + r.choice(NOUNS)
    x, n = r.choice(["items", "blocks", "rows", "ids", "lines"]), r.randint(2, 64)
    kind = r.randrange(5)
    if kind == 0:
        return (f"def {f}({x}: list[int], limit: int = {n}) -> int:\n"
                f"    total = 0\n    for i, v in enumerate({x}):\n        if i >= limit:\n            break\n"
                f"        total += v * {r.randint(2, 9)}\n    return total\n")
    if kind == 1:
        return (f"function {f}({x}) {{\n  const out = [];\n  for (let i = 0; i < {x}.length; i++) {{\n"
                f"    if ({x}[i] % {n} === 0) out.push({x}[i]);\n  }}\n  return out;\n}}\n")
    if kind == 2:
        return (f"$ python -m pytest tests/test_{f}.py -q --maxfail={r.randint(1, 5)}\n"
                f"$ git log --oneline | head -n {n}\n$ export BLOCK_SIZE={r.choice([16, 32, 64])}\n")
    if kind == 3:
        return (f'{{"name": "{f}", "size": {n}, "enabled": {r.choice(["true", "false"])}, '
                f'"tags": ["{r.choice(ADJS)}", "{r.choice(WEATHER)}"], "ratio": {r.random():.3f}}}\n')
    return f"SELECT id, name FROM {x} WHERE size > {n} ORDER BY name LIMIT {r.randint(5, 50)};\n"


def chinese(r: random.Random) -> str:
    k = r.random()
    if k < 0.15:
        return r.choice(ZH_EXTRA)
    if k < 0.6:
        w1, w2 = r.sample(ZH_WORDS, 2)
        return r.choice([
            f"{r.choice(ZH_SUBJ)}觉得这个{w1}很{r.choice(ZH_ADJ)}。",
            f"{w1}旁边有一个{r.choice(ZH_ADJ)}的{w2}。",
            f"{r.choice(ZH_SUBJ)}打算明天去{w1}{r.choice(ZH_ACT)}{w2}。",
            f"为什么{w1}比{w2}更{r.choice(ZH_ADJ)}？",
            f"我们一起{r.choice(ZH_ACT)}了{w1}和{w2}，大家都很{r.choice(ZH_ADJ)}。",
        ])
    return r.choice(ZH_SUBJ) + r.choice(ZH_VERB) + r.choice(ZH_OBJ) + r.choice(ZH_TAIL)


def make_corpus(seed: int = 1234, target_bytes: int = 290_000) -> str:
    """Build the corpus text; same seed, same text."""
    r = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < target_bytes:
        k = r.random()
        if k < 0.12:
            block = " ".join(sentence(r) for _ in range(r.randint(2, 5)))
        elif k < 0.24:
            block = " ".join(rich(r) for _ in range(r.randint(2, 5)))
        elif k < 0.33:
            block = " ".join(musing(r) for _ in range(r.randint(2, 4)))
        elif k < 0.52:
            block = explain(r)
        elif k < 0.62:
            block = dialogue(r)
        elif k < 0.72:
            block = numbers(r)
        elif k < 0.84:
            block = code(r)
        else:
            block = "".join(chinese(r) for _ in range(r.randint(1, 3)))
        if r.random() < 0.06:
            block += " " + r.choice(EMOJI)
        parts.append(block.rstrip())
        size += len(block.encode("utf-8")) + 2
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "engine" / "builtin" / "corpus.txt"
    out.write_text(make_corpus(), encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
