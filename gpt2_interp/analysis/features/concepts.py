"""Built-in contrast concepts for steering: contrast pairs, held-out prompts and target words.

``CONCEPTS[name]`` is ``(pairs, prompts, words)``: ``pairs`` are ``(positive, negative)`` versions of the same
sentence, ``prompts`` held-out openings the direction is not built from, ``words`` the target words whose
summed next-token probability measures the behaviour (read per token: :func:`single_tokens`). ``gpt2-interp
steer --concept NAME`` uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...model import HookedGPT2

#: French (positive) and English (negative) versions of the same sentence
FRENCH_PAIRS = [
    ("Il fait très beau aujourd'hui.", "The weather is very nice today."),
    ("Je voudrais une tasse de café, s'il vous plaît.", "I would like a cup of coffee, please."),
    (
        "Mon frère habite dans une petite maison près de la rivière.",
        "My brother lives in a small house near the river.",
    ),
    ("Nous allons au marché ce matin.", "We are going to the market this morning."),
    ("Les enfants jouent dans le jardin.", "The children are playing in the garden."),
    ("Elle lit un livre chaque soir avant de dormir.", "She reads a book every evening before bed."),
    ("Le train part à huit heures.", "The train leaves at eight o'clock."),
    ("Je ne comprends pas la question.", "I do not understand the question."),
    ("Où est la gare ?", "Where is the train station?"),
    ("Ce restaurant sert une cuisine excellente.", "This restaurant serves excellent food."),
    ("Ma mère travaille à l'hôpital.", "My mother works at the hospital."),
    ("Le chat dort sur le canapé.", "The cat is sleeping on the sofa."),
    ("Nous habitons ici depuis dix ans.", "We have lived here for ten years."),
    ("Il a oublié ses clés à la maison.", "He forgot his keys at home."),
    ("Le musée est fermé le lundi.", "The museum is closed on Mondays."),
    ("J'apprends à jouer du piano.", "I am learning to play the piano."),
    ("Le professeur explique la leçon aux élèves.", "The teacher explains the lesson to the students."),
    ("Il pleut et les rues sont mouillées.", "It is raining and the streets are wet."),
    ("Ils ont acheté une nouvelle voiture la semaine dernière.", "They bought a new car last week."),
    ("Pouvez-vous m'aider à porter ces boîtes ?", "Can you help me carry these boxes?"),
    ("Le soleil se lève à l'est.", "The sun rises in the east."),
    ("Mes amis viennent dîner ce soir.", "My friends are coming to dinner tonight."),
    ("Le pain de cette boulangerie est délicieux.", "The bread in this bakery is delicious."),
    ("Nous avons marché sur la plage tout l'après-midi.", "We walked along the beach all afternoon."),
    ("Le médecin dit que je dois me reposer.", "The doctor says that I need to rest."),
    ("Son chien est noir et blanc.", "Her dog is black and white."),
    ("Je n'ai jamais vu la mer.", "I have never seen the sea."),
    ("La bibliothèque ouvre à neuf heures du matin.", "The library opens at nine in the morning."),
    ("La ville est belle au printemps.", "The city is beautiful in the spring."),
    ("Il boit du thé sans sucre.", "He drinks tea without sugar."),
    ("Nous devons acheter du lait et des œufs.", "We need to buy milk and eggs."),
    ("Le film était long mais intéressant.", "The film was long but interesting."),
    ("Mon grand-père raconte des histoires merveilleuses.", "My grandfather tells wonderful stories."),
    ("Le magasin est au coin de la rue.", "The shop is on the corner of the street."),
    ("Je pense qu'elle a raison.", "I think that she is right."),
    ("Les oiseaux chantent dans les arbres.", "The birds are singing in the trees."),
    ("Notre maison a une porte rouge.", "Our house has a red door."),
    ("Les étudiants attendent le bus.", "The students are waiting for the bus."),
    ("Il fait froid en hiver dans les montagnes.", "It is cold in winter in the mountains."),
    ("Je t'appellerai demain soir.", "I will call you tomorrow evening."),
]

#: held-out English sentence openings after which the next token is read
FRENCH_PROMPTS = [
    "Yesterday my sister and I went to",
    "The best thing about summer is",
    "When I arrived at the office, the",
    "Our neighbours have a big",
    "Every Sunday, my family likes to",
    "The old man opened the door and",
    "In the morning I usually eat",
    "The new school near our house is",
    "After the concert we decided to",
    "My favourite season of the year is",
    "The river flows through the",
    "At the end of the day, the workers",
    "The little girl asked her father",
    "This book is about a young",
    "On the table there was a",
    "The hotel where we stayed was",
    "I really want to visit",
    "During the holidays we often",
    "The farmer goes to the field",
    "Last night the wind was",
]

#: French function words: the target behaviour is the summed probability of these next tokens
FRENCH_WORDS = [
    " le",
    " la",
    " les",
    " de",
    " des",
    " et",
    " est",
    " un",
    " une",
    " du",
    " dans",
    " pour",
    " que",
    " qui",
    " il",
    " elle",
    " je",
    " nous",
    " vous",
    " sur",
    " pas",
    " au",
    " avec",
    " ce",
    " cette",
    " sont",
    " mais",
    " très",
    " à",
    " aux",
    " était",
    " leur",
    " ses",
    " son",
    " sa",
    " mon",
    " ma",
]

#: positive (positive) and negative (negative) versions of the same sentence
SENTIMENT_PAIRS = [
    ("I loved this movie, it was wonderful.", "I hated this movie, it was terrible."),
    ("The food was delicious and the staff were friendly.", "The food was disgusting and the staff were rude."),
    ("What a beautiful day, I feel so happy.", "What an awful day, I feel so miserable."),
    ("This is the best book I have ever read.", "This is the worst book I have ever read."),
    ("The hotel room was clean and comfortable.", "The hotel room was dirty and uncomfortable."),
    ("I am thrilled with my new phone.", "I am furious with my new phone."),
    ("The concert was amazing from start to finish.", "The concert was boring from start to finish."),
    ("Our teacher is kind and patient.", "Our teacher is cruel and impatient."),
    ("The service here is excellent.", "The service here is horrible."),
    ("I had a fantastic time at the party.", "I had a dreadful time at the party."),
    ("She gave a brilliant performance.", "She gave a pathetic performance."),
    ("The garden looks lovely in the spring.", "The garden looks ugly in the spring."),
    ("This coffee tastes great.", "This coffee tastes awful."),
    ("My holiday was perfect.", "My holiday was a disaster."),
    ("The new design is elegant and simple.", "The new design is clumsy and confusing."),
    ("I am grateful for your help.", "I am annoyed by your help."),
    ("The kids were delighted with their gifts.", "The kids were disappointed with their gifts."),
    ("The game was exciting and fun.", "The game was dull and frustrating."),
    ("He is a generous and honest man.", "He is a selfish and dishonest man."),
    ("The weather was pleasant all week.", "The weather was miserable all week."),
    ("I enjoy working with this team.", "I dread working with this team."),
    ("The view from the hill was breathtaking.", "The view from the hill was depressing."),
    ("This is a wonderful place to live.", "This is a horrible place to live."),
    ("The results were impressive.", "The results were disappointing."),
    ("Thank you, this is exactly what I wanted.", "Sorry, this is nothing like what I wanted."),
    ("The music made me smile.", "The music made me cry."),
    ("Our trip was a great success.", "Our trip was a complete failure."),
    ("The nurse was gentle and caring.", "The nurse was harsh and careless."),
    ("I love the way this song sounds.", "I hate the way this song sounds."),
    ("The meeting went really well.", "The meeting went really badly."),
]

#: held-out neutral openings of an opinion
SENTIMENT_PROMPTS = [
    "I think the movie was",
    "In my opinion, the restaurant is",
    "Overall, the experience was",
    "My new job is",
    "The weather this weekend was",
    "To be honest, the book was",
    "The hotel staff were",
    "Yesterday's game was",
    "The food at the party was",
    "I have to say that the concert was",
    "Our neighbours are",
    "The new teacher seems",
    "This city is",
    "The service was",
    "My week has been",
    "The trip to the mountains was",
    "His latest song is",
    "The design of this car is",
    "The meeting was",
    "Living here is",
]

#: positive words: the target behaviour is the summed probability of these next tokens
POSITIVE_WORDS = [
    " great",
    " good",
    " wonderful",
    " amazing",
    " excellent",
    " fantastic",
    " beautiful",
    " lovely",
    " perfect",
    " awesome",
    " brilliant",
    " delicious",
    " happy",
    " love",
    " best",
    " nice",
    " fun",
    " enjoyable",
    " pleasant",
    " incredible",
    " friendly",
    " impressive",
    " superb",
    " delightful",
]


CONCEPTS = {
    "french": (FRENCH_PAIRS, FRENCH_PROMPTS, FRENCH_WORDS),
    "sentiment": (SENTIMENT_PAIRS, SENTIMENT_PROMPTS, POSITIVE_WORDS),
}


def single_tokens(model: HookedGPT2, words: list[str]) -> list[str]:
    """The words that are one token for this model's tokenizer (the target set is read per token)."""
    return [w for w in dict.fromkeys(words) if len(model.tokenizer.encode_ids(w)) == 1]


__all__ = [
    "CONCEPTS",
    "FRENCH_PAIRS",
    "FRENCH_PROMPTS",
    "FRENCH_WORDS",
    "POSITIVE_WORDS",
    "SENTIMENT_PAIRS",
    "SENTIMENT_PROMPTS",
    "single_tokens",
]
