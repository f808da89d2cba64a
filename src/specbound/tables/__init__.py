"""The numbers behind the command line's math commands: ``bounds`` (every verifier against
α*, with certificates) and ``theory`` ([YIN]'s Markov-chain and bias experiments). Each
function takes plain inputs and returns plain data; printing, plotting and saving are the
command line's."""
