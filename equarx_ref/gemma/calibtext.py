"""The calibration text: written for this project, kept apart from the evaluation text.

Static quantization (`equarx_ref.outliers`) measures the ranges of the AllReduce partial sums on
some text before it is used; measuring them on the text it is then scored on would flatter it.
So calibration reads `CALIB_TEXT`, never `evaltext.EVAL_TEXT`: a dozen short pieces in different
registers (a recipe, a letter, a dialogue, instructions, a news item, a story, a little
arithmetic and code, a list) about subjects the evaluation text does not touch, about 1,700
Gemma tokens. `gemma.calibrate.calibrate_text` cuts it into sequences of a fixed length (six
of 256 tokens by default), each starting with BOS, one calibration batch each.
"""

__all__ = ["CALIB_TEXT"]

CALIB_TEXT = """\
How to Bake a Plain Loaf

Bread asks for four things: flour, water, salt and yeast, and then for patience. Mix five hundred \
grams of strong white flour with ten grams of salt and seven grams of dried yeast, keeping the \
salt and the yeast apart at first. Pour in about three hundred and fifty millilitres of warm \
water and stir until no dry flour remains. The dough will look rough and sticky, and that is \
fine. Turn it out onto the table and knead it for ten minutes, pushing it away with the heel of \
your hand, folding it back and turning it a quarter turn each time. Slowly it becomes smooth and \
elastic. Put it in an oiled bowl, cover it, and leave it somewhere warm until it has doubled in \
size, which may take an hour or two depending on the kitchen. Knock it back, shape it into a \
tight oval, lay it in a tin and let it rise again. Bake at two hundred and twenty degrees for \
about thirty minutes. A loaf is done when it sounds hollow as you tap the bottom.

A Letter Home

Dear Maria,

The train was four hours late, so I arrived in the middle of the night with nowhere to stay. A \
kind woman at the station found me a room above a bakery, and I woke to the smell of bread and \
the noise of delivery vans. The city is larger than I imagined. Everybody walks quickly and \
nobody looks lost, except me. Tomorrow I start at the office. I have bought a warm coat, since \
the wind here comes straight off the river and cuts through everything. Please tell Father that \
the old watch still keeps perfect time, and tell the dog that I miss him more than I miss most \
people. Write soon, and send the recipe for the lemon cake.

With love,
Tomas

At the Repair Shop

"It stopped working on Tuesday," said the customer, placing the radio on the counter.
"Stopped completely, or does it make a noise?"
"A sort of humming. Then nothing."
The repairman unscrewed the back panel and peered inside with a small torch. "Somebody has been \
in here before," he said. "See this wire? It was never meant to be soldered there."
"My brother tried to fix it last year."
"Then your brother owes you a radio." He smiled. "Leave it with me until Friday. It is an old \
set, but the valves are good, and they do not make them like this any more."

Planting a Vegetable Garden

Choose a spot that gets at least six hours of sunlight a day, and keep it close to a tap: a \
garden you have to carry water to is a garden you will neglect. Dig the soil to the depth of a \
spade, remove stones and roots, and work in a few buckets of compost. Start with crops that \
forgive mistakes. Radishes are ready in a month. Lettuce can be picked leaf by leaf for weeks. \
Beans climb whatever you give them, and courgettes produce so much that by late summer you will \
be leaving them on your neighbours' doorsteps. Water in the morning rather than the evening, so \
the leaves dry before night, and pull weeds while they are small.

News in Brief

The town council voted on Thursday to reopen the old swimming baths, closed since the roof was \
damaged in a storm eleven years ago. The repairs are expected to cost just over two million \
pounds, shared between the council and a local trust. Work will begin in the spring, and the \
pool could open to the public by the following autumn. Residents who campaigned for the \
reopening welcomed the decision, though some questioned whether the money might be better spent \
on the roads. A public meeting will be held at the library next month.

The Clockmaker's Apprentice

There was once a clockmaker who lived at the end of a narrow street, in a shop so full of clocks \
that the ticking never stopped. His apprentice was a boy named Pim, who swept the floor, sorted \
the tiny screws into jars and, once a week, wound every clock in the shop. One evening, Pim \
noticed that a tall clock in the corner was running backwards. He said nothing, thinking he must \
be tired. The next morning, the old man's spectacles were on the bench where he had left them \
the day before, and the newspaper on the doorstep carried yesterday's date. Pim looked at the \
clock. Its hands moved slowly, steadily, the wrong way round. He took a deep breath, opened the \
glass, and very gently pushed the minute hand forward.

Numbers and Units

A kilometre is a thousand metres, and a mile is about 1.609 kilometres, so a runner who \
finishes ten kilometres has run a little over six miles. Water boils at 100 degrees Celsius at \
sea level, which is 212 degrees Fahrenheit; to convert, multiply by nine, divide by five and add \
thirty-two. A year has 365 days, or 366 in a leap year, and a leap year comes every four years \
except in most years ending in 00. The year 2000 was a leap year; 1900 was not. If you save 15 \
pounds a week, you will have 780 pounds after a year, before any interest.

A Small Program

The following function returns the largest value in a list, or None when the list is empty:

def largest(values):
    best = None
    for v in values:
        if best is None or v > best:
            best = v
    return best

Calling largest([3, 9, 4]) gives 9, and largest([]) gives None. A careful programmer writes a \
test for each case, including lists with negative numbers and lists where every value is equal.

Before You Travel

- Check that your passport is valid for at least six months.
- Make copies of your tickets and keep them apart from the originals.
- Learn a few words of the local language: hello, please, thank you, and sorry.
- Carry a small amount of local cash for buses and markets.
- Tell someone at home where you will be staying.
- Pack less than you think you need; you can buy almost anything on the way.

On Owls

Owls hunt mostly at night, and almost everything about them is built for it. Their eyes are so \
large that they cannot move them in their sockets; instead an owl turns its whole head, up to \
three quarters of a full circle. Their hearing is sharper still. The feathers around the face \
form a dish that gathers sound, and in many species one ear sits higher than the other, so a \
sound from below reaches them at slightly different times. From that difference the owl can \
locate a mouse under snow without seeing it at all. The leading edges of their wing feathers \
are soft and fringed, which breaks up the rush of air and lets them fly almost silently.

Minutes of the Chess Club

Present: eleven members. The treasurer reported that the club has enough money to buy three new \
boards and a clock. The summer tournament will use a rapid time control of fifteen minutes per \
player, with five seconds added per move. Mr Okafor proposed that beginners be paired with \
experienced players on the first Tuesday of each month; the proposal was carried. The meeting \
closed at nine o'clock, after a short argument about whether the knight is worth more than the \
bishop in the endgame. No conclusion was reached.

A River in Winter

By January the river had slowed to a dark, heavy crawl between banks of frozen reeds. In the \
mornings a thin skin of ice reached out from either side, white at the edges and clear where it \
met the moving water. Herons stood on one leg in the shallows, waiting. Children threw stones to \
hear the ice sing, a strange high note that seemed to come from everywhere at once. Then, one \
night in February, the wind turned to the south, the rain came, and by morning the river was \
loud again, brown and fast and full of broken branches, as if it had never been asleep.
"""
