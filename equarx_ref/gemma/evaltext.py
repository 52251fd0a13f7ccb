"""The English evaluation text: written for this project, so it ships with the package.

About 1,300 Gemma tokens of plain prose on everyday subjects (well past the 512-token sliding
window of the local layers), with a few lines that exercise the tokenizer: runs of spaces,
blank lines, digits, and non-ASCII letters and symbols. `EVAL_TEXT` is what `equarx-ref gemma`,
the notebook and the cross-check against Hugging Face transformers all score.
"""

__all__ = ["EVAL_TEXT"]

EVAL_TEXT = """\
The Lighthouse Keeper's Year

For most of the nineteenth century, a lighthouse was not a machine but a household. A keeper, \
often with a wife and children, lived at the foot of the tower and climbed its stairs several \
times a night. The lamp had to be trimmed, the glass wiped clean of soot, and the clockwork that \
turned the lens wound by hand. If the light failed, ships that trusted it could run onto the \
rocks it was built to mark, so the work was dull, repetitive and never allowed to stop.

The day began at dawn, when the light was put out. The keeper drew the curtains around the lens \
so that the morning sun would not be focused into a point hot enough to scorch the brass or \
crack the glass. Then came the cleaning. Every prism was polished with a soft cloth, every \
window wiped inside and out, and the oil reservoir refilled. A careful keeper kept a logbook in \
which he wrote the weather, the passing ships, the hours the lamp burned and the oil it used. \
Inspectors read these books closely, and a keeper whose numbers did not add up could lose his \
post.

Weather shaped everything. In calm summer months the station might receive visitors: fishermen \
selling their catch, families on holiday, painters who wanted to sketch the tower against the \
sky. In winter the same station could be cut off for weeks. Supply boats could not land in \
heavy seas, and keepers on the most exposed rocks learned to store food, fuel and fresh water \
long before the first storm. Stories from those years describe waves breaking over towers more \
than thirty metres tall, and keepers who watched the sea climb the walls while they tended the \
flame above it.

Fog was the enemy that light could not beat. When the coast disappeared into grey cloud, the \
keeper started the fog signal, which at first was simply a bell struck by hand and later a horn \
driven by compressed air. Each station had its own pattern of sounds, just as each light had \
its own pattern of flashes, so that a captain who counted carefully could tell exactly which \
headland he was passing. A signal that sounded every thirty seconds for a full night of fog \
meant that nobody in the house slept very much.

Technology slowly changed the job. Paraffin replaced whale oil and vegetable oil; incandescent \
mantles gave a brighter flame for the same fuel; electricity arrived at the stations close to \
towns. Radio beacons let ships find their position without seeing the coast at all. Each \
improvement made the light more reliable and the keeper less necessary, and by the second half \
of the twentieth century most lighthouses had been automated. A sensor now decides when \
darkness has fallen, a motor turns the lens, and a technician visits a few times a year.

Many people regret the change, and it is easy to see why. A lighthouse with a family inside it \
was a small community at the edge of the land, and keepers often saved lives directly, rowing \
out to wrecks in weather that kept every other boat in the harbour. Yet the automated lights \
are, by most measures, better at their single task. They do not fall ill, they do not run out \
of oil in a long storm, and they never fall asleep at the wrong moment. The romance of the \
keeper's life was built on hardship that few of us would choose.

What remains is the buildings. Some have become museums, where visitors can climb the same \
stairs and stand beside the great lenses, which look like glass beehives and weigh several \
tonnes. Others are holiday cottages, bird observatories or simply ruins. Walking around one on \
a windy afternoon, it is hard not to imagine the keeper looking out from the gallery, checking \
the horizon, and going back inside to write one more line in the log: wind from the west, \
visibility good, all well.

A Note on Numbers and Names

The tallest traditional lighthouse in Europe, on the Île Vierge off the coast of Brittany, \
stands 82.5 metres high and has 365 steps. The light at Cordouan, begun in 1584 and finished in \
1611, is often called "the Versailles of the sea". In Spain, the Tower of Hercules at A Coruña \
has guided ships since the second century; in Norway, keepers on the island of Ytre Møkkalasset \
measured wind speeds of 40 m/s; and in Japan the lighthouse at Inubōsaki (犬吠埼) opened in \
1874. A typical first-order Fresnel lens has a focal length of 920 mm, and a beam from a tower \
of height h metres reaches about 3.57 × √h kilometres to the horizon — roughly 20 km for a \
30-metre tower.

A keeper's log might look like this:

    Date        Wind     Sea        Oil used
    12 March    NW 5     rough      14 litres
    13 March    W  3     moderate   11 litres
    14 March    calm     smooth      9 litres


Such tables are dull to read, but they are the real history of the lights: thousands of quiet \
nights, each one recorded, each one ending at dawn when the lamp went out and the work began \
again.
"""
